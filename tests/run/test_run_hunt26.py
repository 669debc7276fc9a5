"""Whole programs from the twenty-sixth session's hunt, each a mechanism the virtual run or its fix had wrong.

- A parameter moved by ``p.data = p.data.to("cuda")`` and then trained: on the device its gradient is where its
  data is (torch refuses any other), so the optimizer's step is clean. The virtual run left the gradient on the cpu
  and reported the step (a false positive, and the idiom is one torchdoctor prints itself).
- One cpu tensor given to a Llama at one line and to ``F.embedding`` at the next: both uses fail on the device, so
  the fix is ``device=`` where it is made, never a move at the second use that claims the first use was right
  (that fix was printed as proven while the first use still failed: a false proof).
- An evaluation loop that hands device tensors to numpy at three lines (``np.sum(losses)`` of a list it appended
  to, ``np.array([x, y])``, ``np.asarray(x)``): each line is its own problem, named at the program's line (never
  numpy's own file), and fixed there; applied, the run is clean.
- Latents made with ``device=unet.device`` where accelerate's ``cpu_offload`` keeps the weights on meta (so the
  model says meta) and runs the model on cuda:0: the factory is fixed with the device it runs on, proven; never
  the advice to load weights that are not missing.
- A trainer that saves a smaller checkpoint with ``model.half().state_dict()`` mid-training casts the live model,
  and GradScaler then meets float16 gradients: the fix is that line copying the state dict in float16
  (``{k: v.half() for k, v in model.state_dict().items()}``), a diff; applied, the run is clean.
- A text encoder the program keeps on the cpu on purpose (musubi-tuner's ``--text_encoder_cpu``), whose output is cast
  where it is handed to the model (``dit(latents, context.to(dit_dtype))``): that cast takes the program's device too
  (``context.to(device, dit_dtype)``), proven, never a move of the encoder (the old patch inserted a move before the
  program's own ``.to(te_device)`` on the line that builds it: a no-op).
- A ComfyUI-like lowvram load keeps some layers on the cpu and casts their weights per call; a custom node reads
  one layer's weight directly (``image_embeds @ proj.weight.t() + proj.bias``): the tensors are moved where the
  node reads them, a diff of the node's file, proven; never a move of the model that undoes the partial load.
- LoRA layers cast to float16 with the frozen base (``unet.to(device, dtype=weight_dtype)``), then GradScaler: the
  fix puts the trained parameters alone back in float32 after that line (diffusers' ``cast_training_params``), a
  diff; never ``unet.float()``, which would cast the frozen base too.
- ``torch.cuda.set_device(1)`` in the main thread and a worker thread that makes ``torch.zeros(n, device="cuda")``:
  the current device is per thread (the worker's is cuda:0), so the worker's tensors meet the model's cuda:1 and
  the run says so (it said "no placement error", a false all-clear); the factory's fix never reads the device of
  a cpu argument (``device=prompt_ids.device`` would be the cpu).
- A cache's attention mask made with ``device="cuda"`` (cuda:0) for a model on cuda:1 and handed to it (mistral-inference
  #215): fixed at its factory with the program's own device name (``device=device``), a diff, never "pass input 3
  as ...".
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from run.test_run_cli import ENV, TIMEOUT, run, write

DATA_MOVED = """
    import torch, torch.nn as nn
    w = nn.Parameter(torch.randn(4, 4))
    w.data = w.data.to("cuda")
    lin = nn.Linear(4, 4)
    lin.weight.data = lin.weight.data.to("cuda")
    lin.bias.data = lin.bias.data.to("cuda")
    opt = torch.optim.AdamW([w, *lin.parameters()], lr=1e-3)
    for _ in range(2):
        x = torch.randn(2, 4, device="cuda")
        lin(x @ w).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    print("grad on", w.device, lin.weight.device)
"""

TWO_USES = """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
    model = LlamaForCausalLM(cfg).to("cuda").eval()
    ids = torch.tensor([[1, 5, 6]])
    out = model(input_ids=ids)
    e = torch.nn.functional.embedding(ids, model.model.embed_tokens.weight)
    print("done", e.device)
"""


NUMPY_READS = """
    import numpy as np, torch, torch.nn as nn
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Linear(8, 3).to(device)

    def evaluate():
        losses = []
        for _ in range(2):
            out = model(torch.randn(4, 8, device=device))
            losses.append(out.pow(2).mean())
        mean_loss = np.sum(losses) / len(losses)
        both = np.array([out, out])
        last = np.asarray(out)
        return float(mean_loss), both.shape, last.shape

    print("eval", evaluate())
"""


OFFLOADED = """
    import torch, torch.nn as nn
    from accelerate import cpu_offload

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.out = nn.Conv2d(4, 8, 3, padding=1), nn.Conv2d(8, 4, 3, padding=1)

        @property
        def device(self):
            return next(self.parameters()).device

        def forward(self, x, t):
            return self.out(torch.nn.functional.silu(self.inp(x))) * (1 + t)

    unet = UNet()
    cpu_offload(unet, execution_device=torch.device("cuda:0"))
    latents = torch.randn(1, 4, 8, 8, device=unet.device)
    sigmas = torch.linspace(1.0, 0.0, 3, device=unet.device)
    for i in range(2):
        latents = latents + (sigmas[i + 1] - sigmas[i]) * unet(latents, sigmas[i])
    print("done", latents.shape)
"""


SAVED_HALF = """
    import torch, torch.nn as nn
    device = "cuda"
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda")

    def save_checkpoint():
        sd = model.half().state_dict()  # a smaller file
        return len(sd)

    for step in range(3):
        x = torch.randn(8, 16, device=device)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = (model(x) - x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        if step == 0:
            save_checkpoint()
    print("done")
"""


KEPT_ON_CPU = """
    import torch, torch.nn as nn
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    te_device = torch.device("cpu")  # --text_encoder_cpu
    dit_dtype = torch.bfloat16
    te = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 16)).to(te_device)
    with torch.no_grad():
        context = te(torch.randint(0, 50, (1, 7), device=te_device))
    dit = nn.Linear(16, 16).to(device, dit_dtype)
    with torch.no_grad():
        for _ in range(2):
            out = dit(context.to(dit_dtype))
    print("done", out.shape)
"""


LOWVRAM_OPS = """
    import torch, torch.nn as nn, torch.nn.functional as F

    class Linear(nn.Linear):
        cast_weights = False

        def forward(self, x):
            if self.cast_weights:
                return F.linear(x, self.weight.to(x.device), self.bias.to(x.device))
            return super().forward(x)

    def load_partially(model, device, budget=1):
        for n, m in enumerate(m for m in model.modules() if isinstance(m, Linear)):
            m.cast_weights = n >= budget
            m.to(device if n < budget else "cpu")
"""
LOWVRAM_NODE = """
    def apply_adapter(model, image_embeds):
        proj = model.blocks[1]
        k = image_embeds @ proj.weight.t() + proj.bias
        return k
"""
LOWVRAM_APP = """
    import torch, torch.nn as nn
    import ops
    from custom_nodes.node import apply_adapter

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([ops.Linear(16, 16) for _ in range(3)])

        def forward(self, x):
            for b in self.blocks:
                x = torch.nn.functional.gelu(b(x))
            return x

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Model()
    ops.load_partially(model, device)
    out = model(torch.randn(2, 16, device=device))
    print("done", apply_adapter(model, out).shape)
"""


LORA_FP16 = """
    import torch, torch.nn as nn
    device, weight_dtype = "cuda", torch.float16

    class LoRA(nn.Module):
        def __init__(self, base, r=4):
            super().__init__()
            self.base = base
            self.down = nn.Linear(base.in_features, r, bias=False)
            self.up = nn.Linear(r, base.out_features, bias=False)

        def forward(self, x):
            return self.base(x) + self.up(self.down(x))

    unet = nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 16))
    unet.requires_grad_(False)
    unet[0] = LoRA(unet[0])
    unet.to(device, dtype=weight_dtype)
    params = [p for p in unet.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    scaler = torch.amp.GradScaler("cuda")
    for step in range(2):
        with torch.autocast("cuda", dtype=weight_dtype):
            loss = unet(torch.randn(4, 16, device=device, dtype=weight_dtype)).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    print("done")
"""


THREAD_DEVICE = """
    import threading, torch, torch.nn as nn
    torch.cuda.set_device(1)
    model = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 50)).to("cuda")

    def generate(prompt_ids):
        ids = prompt_ids.to("cuda")
        weights = torch.zeros(ids.shape[0], device="cuda")
        return weights + model(ids)[:, -1].log_softmax(-1).max(-1).values

    out = {}
    t = threading.Thread(target=lambda: out.update(r=generate(torch.tensor([[1, 2, 3]]))))
    t.start()
    t.join()
    print("main", generate(torch.tensor([[1, 2, 3]])).device)
"""


CACHE_MASK = """
    import torch, torch.nn as nn, torch.nn.functional as F

    class Cache:
        def mask(self, n):
            return torch.full((n, n), float("-inf"), device="cuda").triu(1)

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(16, 48)

        def forward(self, x, mask):
            q, k, v = self.qkv(x).chunk(3, -1)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    device = torch.device("cuda:1")
    attn = Attn().to(device)
    x = torch.randn(1, 5, 16, device=device)
    print("done", attn(x, Cache().mask(5)).shape)
"""


def _report(proc: subprocess.CompletedProcess[str]) -> dict:
    out = proc.stdout
    return json.loads(out if out.startswith("{") else out[out.index("\n{") + 1:])


def _applied_clean(tmp_path: Path, report: dict, *args: str) -> None:
    """The run's patch applied with ``git apply``, and the program run again under ``run`` (``args``: its device
    options, ``--device cuda:0`` by default): clean."""
    subprocess.run(["git", "apply", "-"], input=report["patch"], cwd=tmp_path, text=True, check=True, timeout=60)
    again = _report(run(*(args or ("--device", "cuda:0")), "--json", "app.py", cwd=tmp_path))
    assert again["ok"], again["problems"]


def test_a_parameter_moved_by_its_data_trains_clean(tmp_path: Path) -> None:
    write(tmp_path / "app.py", DATA_MOVED)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    assert report["ok"] and not report["problems"], report["problems"]


def test_a_tensor_both_uses_fail_on_is_made_on_the_device(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    write(tmp_path / "app.py", TWO_USES)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    assert not any("uses it as it is" in f["code"] for f in report["fixes"]), report["fixes"]
    assert "-ids = torch.tensor([[1, 5, 6]])\n+ids = torch.tensor([[1, 5, 6]], device=" in report["patch"], report["patch"]
    _applied_clean(tmp_path, report)


def test_each_line_that_hands_numpy_a_device_tensor_is_named_and_fixed(tmp_path: Path) -> None:
    write(tmp_path / "app.py", NUMPY_READS)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    assert sorted(p["path"] for p in report["problems"]) == [f"<numpy read at app.py:{n}>" for n in (11, 12, 13)]
    assert "fromnumeric" not in json.dumps(report)
    for want in ("np.sum([t.detach().cpu() for t in losses])", "np.array([out.detach().cpu(), out.detach().cpu()])",
                 "np.asarray(out.detach().cpu())"):  # (they require grad: numpy refuses them as they are)
        assert f"+    {want}" in report["patch"].replace("mean_loss = ", "").replace("both = ", "").replace(
            "last = ", ""), report["patch"]
    _applied_clean(tmp_path, report)


def test_a_tensor_made_with_an_offloaded_models_meta_device_is_made_where_it_runs(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    write(tmp_path / "app.py", OFFLOADED)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    fixes = [f for f in report["fixes"] if "made it on meta: pass device=" in f["code"]]
    assert len(fixes) == 2 and all(f["proven"] for f in fixes), report["fixes"]
    assert "unet.device is meta: an offload keeps the model's weights there" in fixes[0]["code"]
    assert not any("load the weights" in f["code"] for f in report["fixes"]), report["fixes"]
    _applied_clean(tmp_path, report)


def test_a_live_model_cast_only_to_save_it_is_copied_at_that_line(tmp_path: Path) -> None:
    write(tmp_path / "app.py", SAVED_HALF)
    proc = run("--device", "cuda:0", "app.py", cwd=tmp_path)
    assert "sd = {k: v.half() for k, v in model.state_dict().items()}  # at app.py:9: model.half().state_dict() " \
        "casts the live model to float16 to save it" in proc.stdout + proc.stderr, proc.stderr[-3000:]
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    _applied_clean(tmp_path, report)


def test_the_output_of_a_module_kept_on_the_cpu_is_moved_where_it_is_handed_over(tmp_path: Path) -> None:
    app = write(tmp_path / "app.py", KEPT_ON_CPU)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [fix] = [f for f in report["fixes"] if not f["code"].startswith("# ")]
    assert fix["code"].startswith("out = dit(context.to(device, dit_dtype))  # a module kept on cpu by the program "
                                  "(put there by `te = nn.Sequential("), fix
    assert fix["proven"] and "te.to(" not in json.dumps(report["fixes"]), report["fixes"]
    _applied_clean(tmp_path, report)
    real = subprocess.run([sys.executable, str(app)], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert real.returncode == 0, real.stderr[-2000:]


def test_a_layer_the_app_keeps_on_the_cpu_read_directly_by_a_node_is_moved_where_it_is_read(tmp_path: Path) -> None:
    write(tmp_path / "ops.py", LOWVRAM_OPS)
    (tmp_path / "custom_nodes").mkdir()
    write(tmp_path / "custom_nodes" / "__init__.py", "")
    write(tmp_path / "custom_nodes" / "node.py", LOWVRAM_NODE)
    write(tmp_path / "app.py", LOWVRAM_APP)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [fix] = [f for f in report["fixes"] if not f["code"].startswith("# ")]
    assert fix["code"].startswith("k = image_embeds @ proj.weight.to(image_embeds.device).t() + "
                                  "proj.bias.to(image_embeds.device)  # custom_nodes/node.py:4 reads blocks.1.weight, "
                                  "blocks.1.bias directly"), fix
    assert fix["proven"] and "model.to(" not in json.dumps(report["fixes"]), report["fixes"]
    _applied_clean(tmp_path, report)


def test_lora_weights_cast_with_their_frozen_base_are_put_back_in_float32_alone(tmp_path: Path) -> None:
    write(tmp_path / "app.py", LORA_FP16)
    proc = run("--device", "cuda:0", "app.py", cwd=tmp_path)
    assert "for p in unet.parameters():  # only the trained parameters in float32 (the frozen ones stay float16)" \
        in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert "unet.float()" not in proc.stdout + proc.stderr
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    _applied_clean(tmp_path, report)


def test_the_current_device_is_per_thread(tmp_path: Path) -> None:
    write(tmp_path / "app.py", THREAD_DEVICE)
    report = _report(run("--device", "cuda:1", "--count", "2", "--json", "app.py", cwd=tmp_path))
    assert not report["ok"] and report["problems"], report
    assert all(p["found"] == "cuda:0" for p in report["problems"]), report["problems"]
    assert "prompt_ids.device" not in json.dumps(report["fixes"]), report["fixes"]


def test_an_argument_made_on_the_wrong_gpu_is_fixed_at_its_factory(tmp_path: Path) -> None:
    write(tmp_path / "app.py", CACHE_MASK)
    report = _report(run("--device", "cuda:1", "--count", "2", "--json", "app.py", cwd=tmp_path))
    assert '+        return torch.full((n, n), float("-inf"), device=device).triu(1)' in report["patch"], report
    assert not any(f["code"].startswith("# pass input") for f in report["fixes"]), report["fixes"]
    _applied_clean(tmp_path, report, "--device", "cuda:1", "--count", "2")
