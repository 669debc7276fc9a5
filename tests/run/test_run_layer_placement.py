"""A program that places its model layer by layer itself — partial loading that moves leaf layers while they fit a
budget and leaves the rest casting their weights per call (ComfyUI's lowvram ops, Comfy-Org/ComfyUI #15251), or a
sequential offload by forward pre-hooks on the leaf layers — never moves the Parameters and buffers a module above
the layers owns. ``torchdoctor run`` names only those (never the layers the mechanism moves), and fixes each where
the forward uses it — with the app's own per-call helper when its cast layers use one — never by moving the whole
model (that would undo the placement). The patch applied: the virtual re-run is quiet and plain python runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.apps import committed, run_json

OPS = '''import torch, torch.nn as nn


def cast_to(t, dtype=None, device=None):
    return t if t.device == device and t.dtype == dtype else t.to(device=device, dtype=dtype)


class Linear(nn.Linear):
    cast_weights = False

    def forward(self, x):
        if self.cast_weights:
            w = cast_to(self.weight, dtype=x.dtype, device=x.device)
            return nn.functional.linear(x, w, cast_to(self.bias, dtype=x.dtype, device=x.device))
        return super().forward(x)
'''

# the shape of ComfyUI's ops: the layer hands itself to ``cast_bias_weight``; its module has ``cast_to_input``
OPS_HANDED = '''import torch, torch.nn as nn


def cast_to(weight, dtype=None, device=None, non_blocking=False):
    return weight.to(device=device, dtype=dtype, non_blocking=non_blocking)


def cast_to_input(weight, input, non_blocking=False):
    return cast_to(weight, input.dtype, input.device, non_blocking=non_blocking)


def cast_bias_weight(s, input=None, dtype=None, device=None):
    if input is not None:
        dtype = input.dtype if dtype is None else dtype
        device = input.device if device is None else device
    return cast_to(s.weight, dtype, device), None if s.bias is None else cast_to(s.bias, dtype, device)


class Linear(nn.Linear):
    cast_weights = False

    def forward_cast_weights(self, input):
        weight, bias = cast_bias_weight(self, input)
        return nn.functional.linear(input, weight, bias)

    def forward(self, *args, **kwargs):
        if self.cast_weights:
            return self.forward_cast_weights(*args, **kwargs)
        return super().forward(*args, **kwargs)
'''

LOADER = '''def load_partial(model, device, budget):
    used = 0
    for m in model.modules():
        if not hasattr(m, "cast_weights"):
            continue
        size = sum(p.numel() for p in m.parameters(recurse=False))
        if used + size <= budget:
            m.to(device); used += size
        else:
            m.cast_weights = True
'''

MODEL = '''import torch, torch.nn as nn
from . import ops


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = ops.Linear(d, d)
        self.register_buffer("scale", torch.full((d,), 0.5))

    def forward(self, x):
        return x + self.scale * self.fc(x)


class Decoder(nn.Module):
    def __init__(self, c=4, d=8):
        super().__init__()
        self.proj = ops.Linear(c, d)
        self.tokens = nn.Parameter(torch.zeros(1, 2, d))
        self.blocks = nn.ModuleList(Block(d) for _ in range(3))
        self.out = ops.Linear(d, 3)

    def forward(self, z):
        h = self.proj(z)
        h = torch.cat([self.tokens.expand(h.shape[0], -1, -1), h], dim=1)
        for blk in self.blocks:
            h = blk(h)
        return self.out(h)
'''

MAIN = '''import torch
from vaeapp.loader import load_partial
from vaeapp.model import Decoder

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
vae = Decoder()
load_partial(vae, device, budget=120)
with torch.no_grad():
    out = vae(torch.randn(2, 5, 4, device=device))
print("decoded", tuple(out.shape))
'''

OFFLOAD = '''import torch, torch.nn as nn


def sequential_offload(model, device):
    for m in model.modules():
        if not list(m.children()) and list(m.parameters(recurse=False)):
            m.register_forward_pre_hook(lambda mod, args: mod.to(device) and None)
            m.register_forward_hook(lambda mod, args, out: mod.to("cpu") and None)
    return model


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(d), nn.Linear(d, d)
        self.gate = nn.Parameter(torch.full((d,), 0.5))

    def forward(self, x):
        return x + self.gate * self.fc(self.norm(x))


class Net(nn.Module):
    def __init__(self, d=8, n=6):
        super().__init__()
        self.inp = nn.Linear(4, d)
        self.register_buffer("pos", torch.zeros(1, n, d))
        self.blocks = nn.ModuleList(Block(d) for _ in range(2))

    def forward(self, z):
        x = self.inp(z) + self.pos
        for b in self.blocks:
            x = b(x)
        return x


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
net = sequential_offload(Net(), device)
with torch.no_grad():
    y = net(torch.randn(1, 6, 4, device=device))
print("ran", tuple(y.shape))
'''


def _applied(folder: Path, doc: dict) -> None:
    """The run's patch applied: the virtual re-run is quiet and the program runs with plain python."""
    (folder / "fix.diff").write_text(doc["patch"])
    subprocess.run(["git", "apply", "fix.diff"], cwd=folder, check=True, timeout=60)
    again = run_json(folder / "main.py", "cuda")
    assert again["ok"] and not again["problems"], again["problems"]
    plain = subprocess.run([sys.executable, "main.py"], cwd=folder, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr[-2000:]


@pytest.mark.parametrize("ops, tokens, scale", [
    (OPS, "ops.cast_to(self.tokens, dtype=h.dtype, device=h.device)",
     "ops.cast_to(self.scale, dtype=x.dtype, device=x.device)"),
    (OPS_HANDED, "ops.cast_to_input(self.tokens, h)", "ops.cast_to_input(self.scale, x)")], ids=["direct", "handed"])
def test_partial_loading_fixes_the_decoders_own_tensors_with_the_apps_cast_helper(tmp_path: Path, ops: str,
                                                                                 tokens: str, scale: str) -> None:
    pkg = tmp_path / "vaeapp"
    pkg.mkdir()
    for name, text in (("__init__.py", ""), ("ops.py", ops), ("loader.py", LOADER), ("model.py", MODEL)):
        (pkg / name).write_text(text)
    (tmp_path / "main.py").write_text(MAIN)
    committed(tmp_path)
    doc = run_json(tmp_path / "main.py", "cuda")
    assert {p["path"] for p in doc["problems"]} == {"tokens", "blocks.0.scale", "blocks.1.scale", "blocks.2.scale"}
    codes = "\n".join(f["code"] for f in doc["fixes"])
    assert "torchdoctor.move(" not in codes and "model.to(" not in codes and ".data =" not in codes, codes
    assert f"h = torch.cat([{tokens}.expand(h.shape[0], -1, -1), h], dim=1)" in doc["patch"]
    assert f"return x + {scale} * self.fc(x)" in doc["patch"]
    assert "its layers are placed one by one" in codes and "cast with the app's own per-call helper" in codes
    assert "moving the whole model would undo that placement" in codes
    assert all(f["proven"] for f in doc["fixes"]), doc["fixes"]
    _applied(tmp_path, doc)


def test_sequential_offload_by_hooks_names_only_what_no_hook_moves(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(OFFLOAD)
    committed(tmp_path)
    doc = run_json(tmp_path / "main.py", "cuda")
    # the hooked layers (inp, blocks.*.norm, blocks.*.fc) are on the device when they compute: never named
    assert {p["path"] for p in doc["problems"]} == {"pos", "blocks.0.gate", "blocks.1.gate"}
    codes = "\n".join(f["code"] for f in doc["fixes"])
    assert "torchdoctor.move(" not in codes and "left on cpu" not in codes, codes
    assert "x = self.inp(z) + self.pos.to(z.device)" in doc["patch"]
    assert "return x + self.gate.to(x.device) * self.fc(self.norm(x))" in doc["patch"]
    assert "forward pre-hooks (main.py:7) place 5 of its layers per call" in codes
    assert all(f["proven"] for f in doc["fixes"]), doc["fixes"]
    _applied(tmp_path, doc)


OUTSIDE = '''import torch, torch.nn as nn
from accelerate import cpu_offload


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.gate = nn.Parameter(torch.full((d,), 0.5))

    def forward(self, x):
        return self.fc(x)


class Net(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.inp = nn.Linear(4, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(2))

    def forward(self, z):
        x = self.inp(z)
        for b in self.blocks:
            x = x + b.gate * b(x)
        return x


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
net = cpu_offload(Net(), device)
with torch.no_grad():
    y = net(torch.randn(1, 3, 4, device=device))
print("ran", tuple(y.shape))
'''


def test_accelerate_cpu_offload_weight_read_outside_its_call_reads_the_hooks_copy(tmp_path: Path) -> None:
    """accelerate's sequential offload moves every module's own Parameters in its hook, but a parent reading a
    child's Parameter outside the child's call meets its meta placeholder: fixed at that line with the hook's own
    copy, never "load the weights" (which would undo the offload) nor a move of the model."""
    (tmp_path / "main.py").write_text(OUTSIDE)
    committed(tmp_path)
    doc = run_json(tmp_path / "main.py", "cuda")
    codes = "\n".join(f["code"] for f in doc["fixes"])
    assert "load_state_dict(state_dict" not in codes and "torchdoctor.move(" not in codes, codes
    assert "# `b.gate` has its values only while `b(...)` runs: read it there (in Block.forward)" in codes
    assert "x = x + b._hf_hook.weights_map['gate'].to(b._hf_hook.execution_device) * b(x)" in doc["patch"]
    assert all(f["proven"] for f in doc["fixes"]), doc["fixes"]
    _applied(tmp_path, doc)


def test_group_offloading_weight_read_outside_its_call_is_moved_at_that_line(tmp_path: Path) -> None:
    """diffusers' group offloading (leaf level: a block's own Parameter joins a group onloaded with that block's
    call) leaves it on the cpu when the parent reads it outside that call: moved where it is read, proven; never a
    move of the whole model (``self.to('cuda:0')``) nor a rebuild of the Parameter."""
    app = OUTSIDE.replace("from accelerate import cpu_offload", "from diffusers.hooks import apply_group_offloading")
    app = app.replace("net = cpu_offload(Net(), device)",
                      'net = Net()\napply_group_offloading(net, onload_device=device, offload_type="leaf_level")')
    (tmp_path / "main.py").write_text(app)
    committed(tmp_path)
    doc = run_json(tmp_path / "main.py", "cuda")
    codes = "\n".join(f["code"] for f in doc["fixes"])
    assert ".to('cuda:0')" not in codes and "build it in __init__" not in codes, codes
    assert "this line reads Block's own gate outside its call, and diffusers' group offloading onloads" in codes
    assert "x = x + b.gate.to(x.device) * b(x)" in doc["patch"]
    assert all(f["proven"] for f in doc["fixes"]), doc["fixes"]
    _applied(tmp_path, doc)


SWAPPED = '''import torch, torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(self.norm(x))


def swap_in(m, args):
    m.to(device)


def swap_out(m, args, out):
    m.to("cpu")


net = nn.Sequential(nn.Linear(4, 8), Block(8), Block(8)).to(device)
net[2].requires_grad_(False)
net[2].register_forward_pre_hook(swap_in)
net[2].register_forward_hook(swap_out)


def step(x):
    return net(x.to(device)).square().mean()


for _ in range(2):
    step(torch.randn(3, 4)).backward()
print("trained")
'''


def test_a_block_swapped_out_before_the_backward_is_never_moved_back_at_the_forwards_call(tmp_path: Path) -> None:
    """A block-swap trainer whose swap-out hook moves a block back to the cpu right after its forward: the backward
    reads the saved layer-norm weight there. The fix names the swap-out and the backward, never a move of the whole
    model at the forward's call (the hook moves it away again after every forward)."""
    (tmp_path / "main.py").write_text(SWAPPED)
    doc = run_json(tmp_path / "main.py", "cuda")
    codes = "\n".join(f["code"] for f in doc["fixes"])
    assert "net.to(" not in codes and "torchdoctor.move(" not in codes, codes
    assert "# 2.norm: `swap_out` at main.py:20 moved its parameters to cpu after the forward that saved them for " \
        "the backward" in codes, codes
