"""Whole programs from the twenty-eighth session, each a mechanism the virtual run or its fix had wrong.

- A training script that resumes from a checkpoint and loads the optimizer's state before it moves the model
  (``opt.load_state_dict(ckpt["opt"])`` then ``model.to(device)``): torch puts each state tensor on its parameter's
  device when the state is loaded, so the state stays on the cpu and the first step on the GPU raises. The fix is
  the program's own two lines swapped (a diff, proven at the step, where the run put the state where the swapped
  load puts it); applied, the run is clean. In a function, too. Where a line between reads the optimizer (a
  scheduler built on it), the swap could change what that line sees: the fix stays advice, unproven, no patch.
- A training loop's noise made on the cpu (``noise = torch.randn(latents.shape)``) and handed to a diffusers
  scheduler's ``add_noise`` and then to the loss: it fails inside the library first and again at the loss line, so a
  move where the loss line hands it on fixed one use of two (the old patch, "proven" on the library's op as well).
  The maker is given the program's own device name (``device=device``, read from ``latents``' maker), proven at
  every op; applied, the run is clean. A tensor handed on at one line only keeps its fix at that line.
- ``torch.arange`` on the cpu meeting a model on the GPU the program picked (``cuda:0``) while the run was asked for
  another index (``--device cuda:1``): nanoGPT's ``pos = torch.arange(T)`` in forward and a caller's
  ``position_ids`` into a Llama. The program's pick is the side to meet (the weights were blamed and moved to the
  cpu, or the whole model "moved to cuda:1"); the maker is given the device, proven; applied, the run is clean.
- A checkpoint loaded with ``map_location="cpu"`` whose class weights meet the GPU, and a draw from a generator on
  the GPU with no ``device=``: the patch writes the program's own names (``map_location=device``,
  ``device=generator.device``), never ``'cuda:0'`` (which crashes the program's cpu fallback); ``torch.load`` is
  said to take ``map_location=``, never ``device=``.
- A min-SNR weight that indexes a diffusers scheduler's cpu table with the GPU's timesteps
  (``sched.alphas_cumprod[timesteps]``): the table is the odd one (the timesteps were moved to the cpu, which the
  unet then met), moved to its indices' device where the program's line reads it, a diff, proven; never a
  ``device=`` inside the library's ``linspace``.
- A ComfyUI-style model manager that unloads the text encoder to load the unet, and a second prompt encoded
  after it: the encoder is moved back where the manager's unload put it away (named), never a move where it is
  built (the old patch, "proven", which the unload undoes: the patched run failed the same way).
- A ``.float()`` in the forward of a model the program puts in ``float16`` on a GPU and ``bfloat16`` on the cpu:
  the cast is written with the layer's dtype as the program names it (``self.fc1(h.to(self.fc1.weight.dtype))``),
  never ``torch.float16`` written out (which broke the program's bf16 branch on the cpu).
- A Forge-style low-vram model whose blocks a forward pre-hook of the program's own moves to the GPU per call,
  and whose root holds a ``pos_embed`` Parameter no hook moves: the run never saw the model moved, so the
  parameter was taken for an activation ("the tensors made on cpu ... tensor.to('cuda:0')", no patch); it is the
  root's own parameter, moved where the forward reads it (``self.pos_embed.to(x.device)``), a diff, proven.
- An EMA copy made before the model's move and never moved (``ema = copy.deepcopy(model)``), updated in place:
  the copy is moved (``ema.to(...)``), never the update's operands to the cpu "where the program keeps it" -- the
  program never put it there (``tests/virtual/test_rt_training_apps.py``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from run.test_run_cli import run, write
from run.test_run_hunt26 import _applied_clean, _report

RESUME = """
    import os, tempfile
    import torch
    from torch import nn

    device = "cuda" if torch.cuda.is_available() else "cpu"
    path = os.path.join(tempfile.mkdtemp(), "ckpt.pt")
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    net(torch.randn(4, 8)).sum().backward()
    opt.step()
    torch.save({"model": net.state_dict(), "opt": opt.state_dict()}, path)

    net2 = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt2 = torch.optim.AdamW(net2.parameters(), lr=1e-3)
    ckpt = torch.load(path)
    net2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["opt"])
    net2.to(device)
    for _ in range(2):
        loss = net2(torch.randn(4, 8, device=device)).sum()
        opt2.zero_grad()
        loss.backward()
        opt2.step()
    print("done")
"""

IN_FUNCTION = """
    import io
    import torch
    from torch import nn

    def resume(blob, device):
        model = nn.Linear(8, 2)
        optimizer = torch.optim.Adam(model.parameters())
        state = torch.load(io.BytesIO(blob))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        model = model.to(device)
        return model, optimizer

    m = nn.Linear(8, 2)
    o = torch.optim.Adam(m.parameters())
    m(torch.randn(2, 8)).sum().backward()
    o.step()
    buf = io.BytesIO()
    torch.save({"model": m.state_dict(), "optimizer": o.state_dict()}, buf)
    model, optimizer = resume(buf.getvalue(), torch.device("cuda"))
    model(torch.randn(2, 8, device="cuda")).sum().backward()
    optimizer.step()
"""

SCHEDULER_BETWEEN = """
    import io
    import torch
    from torch import nn

    m = nn.Linear(8, 2)
    o = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    m(torch.randn(2, 8)).sum().backward()
    o.step()
    buf = io.BytesIO()
    torch.save(o.state_dict(), buf)
    buf.seek(0)

    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt.load_state_dict(torch.load(buf))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    model.cuda()
    model(torch.randn(2, 8, device="cuda")).sum().backward()
    opt.step()
    sched.step()
"""


NOISE_TWO_USES = """
    import torch
    from diffusers import DDPMScheduler

    device = "cuda" if torch.cuda.is_available() else "cpu"
    sched = DDPMScheduler(num_train_timesteps=100)
    unet = torch.nn.Conv2d(4, 4, 3, padding=1).to(device)
    opt = torch.optim.AdamW(unet.parameters(), lr=1e-4)
    for step in range(2):
        latents = torch.randn(2, 4, 8, 8, device=device)
        noise = torch.randn(latents.shape)
        timesteps = torch.randint(0, 100, (2,), device=device)
        noisy = sched.add_noise(latents, noise, timesteps)
        loss = torch.nn.functional.mse_loss(unet(noisy), noise)
        loss.backward()
        opt.step()
        opt.zero_grad()
"""


def test_a_tensor_handed_on_at_two_lines_is_made_on_the_device(tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    write(tmp_path / "app.py", NOISE_TWO_USES)
    report = _report(run("--device", "cuda:1", "--json", "app.py", cwd=tmp_path))
    assert not report["ok"]
    [fix] = report["fixes"]
    assert fix["proven"] is True, fix
    assert "-    noise = torch.randn(latents.shape)\n+    noise = torch.randn(latents.shape, device=device)\n" in \
        report["patch"], report["patch"]
    assert "noise.to(" not in report["patch"]
    _applied_clean(tmp_path, report, "--device", "cuda:1")


def test_a_state_loaded_before_the_move_is_loaded_after_it_by_a_proven_swap(tmp_path: Path) -> None:
    write(tmp_path / "app.py", RESUME)
    report = _report(run("--device", "cuda:1", "--json", "app.py", cwd=tmp_path))
    assert not report["ok"]
    [p] = report["problems"]
    assert p["role"] == "optimizer" and p["found"] == "cpu", p
    [fix] = report["fixes"]
    assert fix["proven"] is True, fix
    assert fix["code"].startswith("# opt2.load_state_dict(ckpt['opt']) ran before net2.to(device)"), fix["code"]
    assert "net2.to(device)\nopt2.load_state_dict(ckpt['opt'])  # after the move" in fix["code"], fix["code"]
    assert '-opt2.load_state_dict(ckpt["opt"])\n net2.to(device)\n+opt2.load_state_dict(ckpt["opt"])\n' in \
        report["patch"], report["patch"]
    _applied_clean(tmp_path, report, "--device", "cuda:1")
    assert "done" in run("app.py", cwd=tmp_path).stdout  # and on the cpu, as before


def test_the_swap_in_a_function_and_an_assigned_move(tmp_path: Path) -> None:
    write(tmp_path / "app.py", IN_FUNCTION)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [fix] = report["fixes"]
    assert fix["proven"] is True, fix
    assert '-    optimizer.load_state_dict(state["optimizer"])\n     model = model.to(device)\n' \
        '+    optimizer.load_state_dict(state["optimizer"])\n' in report["patch"], report["patch"]
    _applied_clean(tmp_path, report)


def test_a_line_between_that_reads_the_optimizer_keeps_the_fix_advice(tmp_path: Path) -> None:
    write(tmp_path / "app.py", SCHEDULER_BETWEEN)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [p] = report["problems"]
    assert p["role"] == "optimizer", p
    [fix] = report["fixes"]
    assert fix["proven"] is False and not report["patch"], (fix, report["patch"])
    assert "opt.load_state_dict(...)  # after model.to('cuda:0')" in fix["code"], fix["code"]


GPT_POS = """
    import torch, torch.nn as nn
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    class TinyGPT(nn.Module):
        def __init__(self, vocab=50, dim=16, ctx=16):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
            self.head = nn.Linear(dim, vocab)

        def forward(self, idx):
            pos = torch.arange(idx.shape[1])
            return self.head(self.tok(idx) + self.pos(pos))

    model = TinyGPT().to(device)
    print(model(torch.randint(0, 50, (2, 12), device=device)).shape)
"""

LLAMA_POSITIONS = """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).to(device)
    batch = torch.randint(3, 128, (2, 12))
    input_ids = batch.to(device)
    position_ids = torch.arange(batch.shape[1]).unsqueeze(0).expand(2, -1)
    model(input_ids=input_ids, position_ids=position_ids, labels=input_ids).loss.backward()
"""


@pytest.mark.parametrize("text, old, new", [
    (GPT_POS, "        pos = torch.arange(idx.shape[1])\n", "        pos = torch.arange(idx.shape[1], device=idx.device)\n"),
    (LLAMA_POSITIONS, "position_ids = torch.arange(batch.shape[1]).unsqueeze(0)",
     "position_ids = torch.arange(batch.shape[1], device=device).unsqueeze(0)")], ids=["nanogpt pos", "llama position_ids"])
def test_a_cpu_arange_meets_the_device_the_program_picked(tmp_path: Path, text: str, old: str, new: str) -> None:
    if "transformers" in text:
        pytest.importorskip("transformers")
    write(tmp_path / "app.py", text)
    report = _report(run("--device", "cuda:1", "--json", "app.py", cwd=tmp_path))
    assert not report["ok"]
    assert all(p["found"] == "cpu" and p["expected"] == "cuda:0" for p in report["problems"]), report["problems"]
    assert not any(".data" in f["code"] or "move(model" in f["code"] for f in report["fixes"]), report["fixes"]
    assert all(f["proven"] for f in report["fixes"]), report["fixes"]
    assert f"-{old}" in report["patch"] and f"+{new}" in report["patch"], report["patch"]
    _applied_clean(tmp_path, report, "--device", "cuda:1")


CLASS_WEIGHTS = """
    import io, torch, torch.nn as nn, torch.nn.functional as F
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    buf = io.BytesIO()
    torch.save({"class_weights": torch.tensor([1.0, 2.0, 0.5])}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, map_location="cpu", weights_only=True)
    model = nn.Linear(12, 3).to(device)
    x, y = torch.randn(8, 12, device=device), torch.randint(0, 3, (8,), device=device)
    print(F.cross_entropy(model(x), y, weight=ckpt["class_weights"]).item())
"""

GENERATOR = """
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(42)
    latents = torch.randn((1, 3, 8, 8), generator=generator)
    print(latents.to(device).sum().item())
"""


@pytest.mark.parametrize("text, new, said", [
    (CLASS_WEIGHTS, 'ckpt = torch.load(buf, map_location=device, weights_only=True)', "map_location=device"),
    (GENERATOR, "latents = torch.randn((1, 3, 8, 8), generator=generator, device=generator.device).to('cpu')",
     "device=generator.device")], ids=["map_location", "generator"])
def test_a_patch_writes_the_programs_own_device_names(tmp_path: Path, text: str, new: str, said: str) -> None:
    write(tmp_path / "app.py", text)
    report = _report(run("--device", "cuda:1", "--json", "app.py", cwd=tmp_path))
    assert not report["ok"]
    assert f"+{new}\n" in report["patch"] and "cuda:0" not in report["patch"], report["patch"]
    assert any(said in f["code"] for f in report["fixes"]) and not any(
        "torch.load(..., device=" in f["code"] for f in report["fixes"]), report["fixes"]
    subprocess.run(["git", "apply", "-"], input=report["patch"], cwd=tmp_path, text=True, check=True, timeout=60)
    assert run("app.py", cwd=tmp_path).returncode == 0  # the program, patched, still runs on this cpu


MIN_SNR = """
    import torch
    from diffusers import DDPMScheduler
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sched = DDPMScheduler(num_train_timesteps=100)

    def min_snr_weights(timesteps, gamma=5.0):
        alphas = sched.alphas_cumprod[timesteps]
        snr = alphas / (1 - alphas)
        return torch.clamp(snr, max=gamma) / snr

    x0 = torch.randn(2, 3, 8, 8, device=device)
    t = torch.randint(0, 100, (2,), device=device)
    w = min_snr_weights(t)  # (before add_noise, which moves the scheduler's table to the samples' device for good)
    noisy = sched.add_noise(x0, torch.randn_like(x0), t)
    print((noisy.mean(dim=(1, 2, 3)) * w).sum().item())
"""


def test_a_librarys_cpu_table_indexed_on_the_device_is_moved_where_the_line_reads_it(tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    write(tmp_path / "app.py", MIN_SNR)
    report = _report(run("--device", "cuda:1", "--json", "app.py", cwd=tmp_path))
    assert not report["ok"]
    [fix] = report["fixes"]
    assert fix["proven"] is True and fix["code"].startswith(
        "alphas = sched.alphas_cumprod.to(timesteps.device)[timesteps]  # app.py:8: "), fix
    assert "+    alphas = sched.alphas_cumprod.to(timesteps.device)[timesteps]\n" in report["patch"], report["patch"]
    assert "device='cpu'" not in report["patch"]
    _applied_clean(tmp_path, report, "--device", "cuda:1")


MANAGER = """
    import torch, torch.nn as nn
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    class ModelManager:
        def __init__(self):
            self.loaded = []
        def load_gpu(self, *models):
            for m in list(self.loaded):
                if m not in models:
                    m.to("cpu"); self.loaded.remove(m)
            for m in models:
                if m not in self.loaded:
                    m.to(device); self.loaded.append(m)

    mm = ModelManager()
    clip = nn.Sequential(nn.Embedding(100, 16), nn.Linear(16, 16))
    unet = nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 16))
    mm.load_gpu(clip)
    ids = torch.randint(0, 100, (1, 8), device=device)
    unet_in = clip(ids)
    mm.load_gpu(unet)
    unet(unet_in)
    unet(clip(ids))  # the second prompt: load_gpu(unet) unloaded the encoder
"""


def test_a_module_a_manager_unloaded_is_never_moved_where_it_is_built(tmp_path: Path) -> None:
    write(tmp_path / "app.py", MANAGER)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    assert not report["ok"]
    assert not report["patch"] or "nn.Linear(16, 16)).to(" not in report["patch"], report["patch"]
    [fix] = report["fixes"]
    assert fix["code"].startswith("clip.to(device)") and "put on cpu by `m.to(\"cpu\"); self.loaded.remove(m)`" in \
        fix["code"], fix["code"]


UPCAST = """
    import torch, torch.nn as nn
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16

    class Head(nn.Module):
        def __init__(self, dim=16):
            super().__init__()
            self.norm, self.fc1, self.fc2 = nn.LayerNorm(dim), nn.Linear(dim, 32), nn.Linear(32, 4)

        def forward(self, x):
            h = self.norm(x)
            h = self.fc1(h.float())
            return self.fc2(torch.relu(h))

    model = Head().to(device, dtype).eval()
    with torch.no_grad():
        print(model(torch.randn(3, 16, device=device, dtype=dtype)).dtype)
"""


def test_a_cast_into_a_layer_is_written_with_the_layers_own_dtype(tmp_path: Path) -> None:
    write(tmp_path / "app.py", UPCAST)
    report = _report(run("--device", "cuda:1", "--json", "app.py", cwd=tmp_path))
    assert not report["ok"]
    assert "+        h = self.fc1(h.to(self.fc1.weight.dtype))\n" in report["patch"], report["patch"]
    _applied_clean(tmp_path, report, "--device", "cuda:1")
    assert "bfloat16" in run("app.py", cwd=tmp_path).stdout  # the cpu branch, patched, runs


LOWVRAM = """
    import torch, torch.nn as nn
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    class DiT(nn.Module):
        def __init__(self, d=16, n=3):
            super().__init__()
            self.pos_embed = nn.Parameter(torch.zeros(1, 8, d))
            self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d)) for _ in range(n))
        def forward(self, x):
            x = x + self.pos_embed
            for b in self.blocks:
                x = x + b(x)
            return x

    model = DiT()
    for blk in model.blocks:
        blk.register_forward_pre_hook(lambda module, args: module.to(device))
        blk.register_forward_hook(lambda module, args, out: module.to("cpu"))
    with torch.no_grad():
        print(model(torch.randn(2, 8, 16, device=device)).shape)
"""


def test_a_roots_own_parameter_beside_hook_placed_blocks_is_moved_where_it_is_read(tmp_path: Path) -> None:
    write(tmp_path / "app.py", LOWVRAM)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    assert not report["ok"]
    [p] = report["problems"]
    assert (p["path"], p["role"]) == ("pos_embed", "parameter"), p
    [fix] = report["fixes"]
    assert fix["proven"] is True and fix["code"].startswith("x = x + self.pos_embed.to(x.device)"), fix
    assert "+        x = x + self.pos_embed.to(x.device)\n" in report["patch"], report["patch"]
    _applied_clean(tmp_path, report)
