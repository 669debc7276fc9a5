"""Fixes a run can prove are proven, and say how: an operand fixed at the program's call (a cpu gradient times a cuda
0-dim norm, NeMo Automodel PR #3461: ``g.mul_(coef.to(g.device))``) is re-run at the failing op on copies of its
operands with the fix applied; a ``.numpy()`` of a device tensor is fixed with what a cpu copy of the tensor read
needs (``.cpu()``, ``.detach()`` when it requires grad, ``.float()`` for bfloat16) and proven by running it on that
copy. Each patch applied leaves the run clean."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.apps import run_json

CLIP = '''import torch, torch.nn as nn
model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2)).to("cuda")
model(torch.randn(3, 4, device="cuda")).sum().backward()
grads = [p.grad.detach().to("cpu") for p in model.parameters()]
def clip_(grads, max_norm):
    total = torch.zeros((), device="cuda")
    for g in grads:
        total += g.to("cuda").pow(2).sum()
    coef = (max_norm / (total.sqrt() + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef)
    return total
print(float(clip_(grads, 1.0)))
'''


def test_a_cuda_scalar_into_a_cpu_in_place_op_is_fixed_at_the_call_and_proven(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(CLIP)
    doc = run_json(app, "cuda")
    [fix] = doc["fixes"]
    assert fix["code"].startswith("g.mul_(coef.to(g.device))"), fix["code"]
    assert fix["proven"] is True and fix["tried"].startswith("at the failing op aten.mul_.Tensor at app.py:11")
    assert "+        g.mul_(coef.to(g.device))" in doc["patch"]
    app.write_text(CLIP.replace("g.mul_(coef)", "g.mul_(coef.to(g.device))"))
    again = run_json(app, "cuda")
    assert again["ok"] and not again["fixes"], again["problems"]


READS = {  # a voice pack saved on a GPU, read with torch.load(...).numpy() (stavsap/comfyui-kokoro #21)
    "a loaded tensor": ('torch.save(torch.randn(2, 3, device="cuda"), "voice.pt")\n'
                        'data = torch.load("voice.pt", weights_only=True).numpy()\n',
                        'torch.load("voice.pt", weights_only=True).cpu().numpy()', "(float32)"),
    "a model's output": ('net = torch.nn.Linear(4, 2).to("cuda")\ndata = net(torch.randn(3, 4, device="cuda")).numpy()\n',
                         'net(torch.randn(3, 4, device="cuda")).detach().cpu().numpy()', "(float32, requiring grad)"),
    "a bfloat16 tensor": ('x = torch.ones(3, device="cuda", dtype=torch.bfloat16)\ndata = x.numpy()\n',
                          "x.cpu().float().numpy()", "(bfloat16)"),
}


@pytest.mark.parametrize("case", READS)
def test_a_host_read_is_fixed_with_what_a_copy_of_it_needs_and_proven(tmp_path: Path, case: str) -> None:
    body, read, state = READS[case]
    app = tmp_path / "app.py"
    app.write_text(f"import torch\n{body}print(data.shape)\n")
    doc = run_json(app, "cuda")
    [fix] = [f for f in doc["fixes"] if "numpy reads host memory" in f["code"]]
    assert fix["code"].split("numpy reads host memory: ", 1)[1].startswith(read), fix["code"]
    assert fix["proven"] is True and fix["tried"].startswith(f"on a cpu copy of what app.py:3 read {state}: ")
    subprocess.run(["git", "apply", "-"], input=doc["patch"], cwd=tmp_path, text=True, check=True, timeout=60)
    assert f"data = {read}" in app.read_text()
    again = run_json(app, "cuda")
    assert again["ok"] and not again["fixes"], again["problems"]


def test_a_load_refused_for_a_missing_gpu_is_proven_mapped_to_the_cpu(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint saved on ``cuda:3`` (DESOBAv2 #18) read on a one-GPU run: torch refuses at ``torch.load``; the fix
    ``map_location="cpu"`` is tried on the same file, from a path and from a file object (left where the refusal
    left it), and never re-run where unpickling may run the file's code."""
    import io

    import torch

    import torchdoctor
    from torchdoctor._virtual.loading import mapped_note

    path = tmp_path / "ckpt.pt"
    with monkeypatch.context() as m:  # a file as a training box's GPU 3 writes it: its storages tagged cuda:3
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:3")
        torch.save({"w": torch.ones(2, 2), "step": 7}, path)
    notes = []
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False):
        data = io.BytesIO(path.read_bytes())
        for source, kw in ((path, {}), (data, {}), (path, {"weights_only": False})):
            with pytest.raises(RuntimeError, match="Attempting to deserialize object on CUDA device 3") as info:
                torch.load(source, **kw)
            notes.append(mapped_note(info.value))
        assert data.tell() > 0
    assert notes[0] == notes[1] == '(proven: the same file loaded with map_location="cpu": 1 tensor(s), on the cpu)'
    assert notes[2].startswith("(unproven: not re-run: the file is loaded without weights_only=True")


SCHEDULER = '''import torch
class Scheduler:
    def set_timesteps(self, n, device=None):
        self.sigmas = torch.linspace(1.0, 0.05, n + 1, device=device)
        self.sigmas = self.sigmas.to("cpu")
    def step(self, sample):
        both = torch.stack([self.sigmas[1], torch.ones((), device=sample.device)])
        return sample * both[0]
sched = Scheduler()
sched.set_timesteps(4, device="cuda")
print(sched.step(torch.randn(2, device="cuda")).shape)
'''


def test_a_move_to_the_cpu_in_a_function_given_the_device_is_sent_there(tmp_path: Path) -> None:
    """A scheduler's ``set_timesteps(n, device="cuda")`` that keeps its sigmas on the cpu (diffusers #13488): the move's
    line is fixed to the function's own ``device`` argument (``.to(device)``, PR #13450), proven at the failing op."""
    app = tmp_path / "app.py"
    app.write_text(SCHEDULER)
    doc = run_json(app, "cuda")
    [fix] = doc["fixes"]
    assert fix["code"].startswith("# app.py:5: self.sigmas.to(\"cpu\") sends it to cpu, not to its function's "
                                  "`device` argument (cuda:0, "), fix["code"]
    assert fix["code"].endswith("self.sigmas = self.sigmas.to(device)") and fix["proven"] is True
    subprocess.run(["git", "apply", "-"], input=doc["patch"], cwd=tmp_path, text=True, check=True, timeout=60)
    again = run_json(app, "cuda")
    assert again["ok"] and not again["fixes"], again["problems"]


def test_run_prints_the_load_fix_proven(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    with monkeypatch.context() as m:  # saved on a training box's GPU 3
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:3")
        torch.save({"net": {"weight": torch.ones(2, 4)}}, tmp_path / "ckpt.pt")
    app = tmp_path / "app.py"
    app.write_text('import torch\nckpt = torch.load("ckpt.pt")\nprint(sorted(ckpt))\n')
    doc = run_json(app, "cuda")
    [finding] = doc["findings"]
    assert 'ckpt = torch.load("ckpt.pt", map_location="cpu")' in finding["fix"]
    assert '(proven: the same file loaded with map_location="cpu": 1 tensor(s), on the cpu)' in finding["fix"]
