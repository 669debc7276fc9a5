"""``torchdoctor run`` on issue 41's cases, as a user runs them (a subprocess under a timeout):

- a transformers 5 Llama whose ``rotary_emb`` stays on the CPU runs on a real GPU (its forward moves ``inv_freq`` to
  the input's device on every call): quiet, by mechanism; the same buffer read without that move is named;
- storage judged by what computes with it, the same answer as scan's on the same objects: integer codes behind a
  layer that dequantizes per call are quiet, in a plain layer (or one whose cast is switched off) they are named;
- a problem guard records and the program swallows (``--mode strict|fix``) carries the program's line, with the maker
  of the operand (the cast, its line, what it was made from) and the proven fix;
- a virtual run names the maker of an off-policy operand (``torch.zeros`` without ``device=``, ``.float()``) at the
  line of the user's script, and gives the verdict simulate gives on the same model.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import torchdoctor
from run.test_run_cli import run, write


def _doc(proc: object) -> dict:
    out = proc.stdout  # type: ignore[attr-defined]
    return json.loads(out[out.index('{\n  "schema"'):] if '{\n  "schema"' in out else out[out.index("{"):])


ROTARY = """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2)
    model = LlamaForCausalLM(cfg).eval().to("cuda:1")
    model.model.rotary_emb.to("cpu")  # left on the cpu: its forward moves inv_freq on every call
    ids = torch.randint(0, 64, (1, 6), device="cuda:1")
    with torch.no_grad():
        print("quiet", model(ids).logits.device)

    class ReadsInPlace(LlamaRotaryEmbedding):  # the same buffer, read without the per-call move
        def forward(self, x, position_ids):
            freqs = position_ids[..., None].float() * self.inv_freq  # READS-HERE
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    model.model.rotary_emb.__class__ = ReadsInPlace
    with torch.no_grad():
        print("loud", model(ids).logits.device)
"""


def test_rotary_left_on_cpu_is_quiet_and_the_same_buffer_read_in_place_is_named(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    script = write(tmp_path / "llama.py", ROTARY)
    proc = run("--device", "cuda:1", "--json", str(script), cwd=tmp_path)
    assert "quiet cuda:1" in proc.stdout and "loud cuda:1" in proc.stdout, proc.stderr
    doc = _doc(proc)
    assert proc.returncode == 1 and not doc["ok"], proc.stderr
    # only the forward that reads the buffer in place: never original_inv_freq (the default rope never reads it)
    assert {p["path"] for p in doc["problems"]} == {"model.rotary_emb.inv_freq"}, doc["problems"]
    (p,) = doc["problems"]
    assert (p["kind"], p["found"], p["expected"]) == ("device", "cpu", "cuda:1")
    assert p["where"] == "llama.py:16 in forward"  # the line that read it


STORAGE = """
    import torch
    import torch.nn.functional as F
    from torch import nn

    BF16 = torch.bfloat16

    class BlockLinear(nn.Linear):  # keeps uint8 codes, dequantizes them per call
        def forward(self, x):
            w = ((self.weight.float() - 128) * self.weight_scale.to(self.weight.device)).to(x.dtype)
            return F.linear(x, w.to(x.device), self.bias)

    class Switched(nn.Linear):  # casts per call only when switched on (ComfyUI's ops)
        comfy_cast_weights = False

        def forward(self, x):
            if self.comfy_cast_weights:
                return F.linear(x, self.weight.to(x.device, x.dtype), self.bias)
            return super().forward(x)

    def build():
        m = nn.Sequential(nn.Linear(8, 8), BlockLinear(8, 8), nn.Linear(8, 8), Switched(8, 8)).to(BF16)
        for i in (1, 2, 3):
            m[i].weight = nn.Parameter(torch.full((8, 8), 128, dtype=torch.uint8), requires_grad=False)
        m[1].weight_scale = torch.ones(8, 1)
        return m

    if __name__ == "__main__":
        model = build().to("cuda:1")
        x = torch.ones(1, 8, dtype=BF16, device="cuda:1")
        for i in range(4):
            try:
                x = model[i](x)
            except RuntimeError as e:
                print("refused", i)
"""


def test_storage_gets_the_same_answer_in_scan_and_in_a_virtual_run(tmp_path: Path) -> None:
    script = write(tmp_path / "app.py", STORAGE)
    spec = importlib.util.spec_from_file_location("_h6_storage_app", script)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    scanned = {(p.path, p.kind, p.found, p.expected) for p in torchdoctor.scan(mod.build()).problems}
    assert scanned == {("2.weight", "dtype", "uint8", "bfloat16"), ("3.weight", "dtype", "uint8", "bfloat16")}
    proc = run("--device", "cuda:1", "--json", str(script), cwd=tmp_path)
    assert "refused 2" in proc.stdout and "refused 3" in proc.stdout and "refused 1" not in proc.stdout
    doc = _doc(proc)
    ran = {(p["path"], p["kind"], p["found"], p["expected"]) for p in doc["problems"]}
    assert ran == scanned, doc["problems"]
    assert all("is not a dequantization" in p["message"] for p in doc["problems"])


SWALLOWS = """
    import torch
    from torch import nn

    class Up(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            h = x.float()
            return self.lin(h)

    model = nn.Sequential(nn.Linear(8, 8), Up()).to(torch.bfloat16)
    try:
        model(torch.randn(2, 8, dtype=torch.bfloat16))
    except RuntimeError:
        pass  # swallowed: only guard's own record has it
    print("done")
"""


@pytest.mark.parametrize("mode", ["strict", "fix"])
def test_a_swallowed_problem_guard_recorded_carries_its_line_and_maker(tmp_path: Path, mode: str) -> None:
    script = write(tmp_path / "app.py", SWALLOWS)
    proc = run("--mode", mode, "--file", str(tmp_path / "out.json"), str(script), cwd=tmp_path)
    assert "done" in proc.stdout and proc.returncode == 1, proc.stderr
    (f,) = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))["findings"]
    assert f["how"] in (f"recorded by --mode {mode}", f"aligned by --mode {mode}")
    assert f["where"] == "app.py:12 in forward"  # the op's line in the user's script, not guard's or torch's
    assert "made by `.float()` at" in f["culprit"] and "app.py:11" in f["culprit"] and "from x (bfloat16)" in f["culprit"]
    assert "fix proven" in f["culprit"] and "x.to(torch.bfloat16)" in f["fix"] and "app.py:11" in f["fix"]
    assert f"by --mode {mode} at app.py:12 in forward: what guard recorded" in proc.stderr  # the summary too


MAKERS = """
    import torch
    from torch import nn

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            mask = torch.zeros(x.shape[0], 8)
            return self.lin(x.float()) + mask

    def build():
        return nn.Sequential(nn.Linear(8, 8), Masked())

    if __name__ == "__main__":
        model = build().to("cuda:1", torch.bfloat16)
        print(model(torch.ones(2, 8, device="cuda:1", dtype=torch.bfloat16)).device)
"""


def test_a_virtual_run_names_each_maker_at_the_users_line_and_agrees_with_simulate(tmp_path: Path) -> None:
    script = write(tmp_path / "app.py", MAKERS)
    proc = run("--device", "cuda:1", "--dtype", "bfloat16", "--json", str(script), cwd=tmp_path)
    doc = _doc(proc)
    assert proc.returncode == 1 and not doc["ok"], proc.stderr
    by_kind = {p["kind"]: p for p in doc["problems"]}
    assert set(by_kind) == {"device", "dtype"}, doc["problems"]
    assert "a tensor made by torch.zeros in `1` at" in by_kind["device"]["message"]
    assert "app.py:11" in by_kind["device"]["message"]
    assert "a tensor made by `float()` at" in by_kind["dtype"]["message"]
    assert "app.py:12" in by_kind["dtype"]["message"]
    assert {p["where"] for p in doc["problems"]} == {"app.py:12 in forward"}
    # simulate on the same model: the same problems, the same makers
    spec = importlib.util.spec_from_file_location("_h6_makers_app", script)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sim = torchdoctor.simulate(mod.build(), (torch.ones(2, 8),), "cuda:1", dtype=torch.bfloat16)
    assert {(p.kind, p.path, p.found, p.expected) for p in sim.problems} == \
        {(p["kind"], p["path"], p["found"], p["expected"]) for p in doc["problems"]}
    # (simulate names the file by its last two parts, run relative to the program's folder)
    made = {p.kind: p.message.split(" f32[")[0].replace(f"{tmp_path.name}/", "") for p in sim.problems}
    assert made == {k: p["message"].split(" f32[")[0] for k, p in by_kind.items()}
    assert doc["fixes"] and all(f["proven"] for f in doc["fixes"])
