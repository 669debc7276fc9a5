"""Session 15, guard: a dequantizing forward whose cast the same line undoes (`w.to(dt) * fp32_scale`) gets the
line's whole value cast where it is assigned, proven, in explain and strict alike; the float8 storage it dequantizes
is never cast (hunt U22, U29). Applying the printed diff makes the program run clean under strict."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import types

import pytest
import torch

import torchdoctor

BF = torch.bfloat16

PROGRAM = '''import torch
import torch.nn.functional as F
from torch import nn


def fp8_forward(self, x):
    original_dtype = self.scale_weight.dtype
    dequantized_weight = self.weight.to(original_dtype) * self.scale_weight
    return F.linear(x, dequantized_weight, self.bias.to(x.dtype))


def quantize(model):
    for lin in model.modules():
        if isinstance(lin, nn.Linear):
            w = lin.weight.data.float()
            s = w.abs().amax() / 448.0
            lin.weight.data = (w / s).to(torch.float8_e4m3fn)
            lin.register_buffer("scale_weight", s.reshape(1).float())
            lin.forward = fp8_forward.__get__(lin)
    return model


def build():
    torch.manual_seed(0)
    return quantize(nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)).to(torch.bfloat16))
'''


def _load(path: pathlib.Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_dequantized_weight_cast_where_assigned_proven_and_the_patch_fixes_every_layer(
        tmp_path: pathlib.Path, mode: str) -> None:
    src = tmp_path / f"fp8prog_{mode}.py"
    src.write_text(PROGRAM)
    prog = _load(src, f"fp8prog_{mode}")
    model = prog.build()
    before = {n: (t.dtype, t.clone()) for n, t in model.state_dict().items()}
    with pytest.raises(torchdoctor.PlacementError) as info, torch.no_grad(), torchdoctor.guard(model, mode=mode):
        model(torch.randn(1, 8, dtype=BF))
    err = info.value
    said = str(err)
    assert "made by `.to(original_dtype)` at " in said
    assert err.proof is not None and err.proof.startswith(
        "fix proven: Linear runs again with `dequantized_weight` cast where it is assigned at fp8prog_")
    assert err.fix.startswith("dequantized_weight = (self.weight.to(original_dtype) * self.scale_weight).to(x.dtype)")
    assert "float8_e4m3fn" not in err.fix and ".data = " not in err.fix  # the float8 storage is never cast
    for n, t in model.state_dict().items():  # the proof ran on the model and put it back as it was
        assert t.dtype == before[n][0] and torch.equal(t.float(), before[n][1].float())
    assert err.patch is not None
    (tmp_path / "fix.patch").write_text(err.patch)
    done = subprocess.run(["patch", "-p1", "-i", "fix.patch"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    fixed = _load(src, f"fp8prog_{mode}_fixed")
    model = fixed.build()
    with torch.no_grad(), torchdoctor.guard(model, mode="strict"):
        out = model(torch.randn(1, 8, dtype=BF))  # both layers: the shared line is fixed
    assert out.dtype == BF
    assert model[0].weight.dtype == torch.float8_e4m3fn


INT8_PROGRAM = '''import torch
from torch import nn
import bitsandbytes as bnb


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(64, 64)
        self.lm_head = bnb.nn.Linear8bitLt(64, 128, bias=False, has_fp16_weights=False)

    def forward(self, x):
        return self.body(x)


def logits(hidden, lm_head):
    return torch.matmul(hidden, lm_head.weight.t())


def app(m):
    m.to("cpu")
    m.body.to(torch.bfloat16)
    return logits(m(torch.randn(2, 64, dtype=torch.bfloat16)), m.lm_head)
'''


@pytest.mark.parametrize("mode", ["explain", "strict", "warn", "fix"])
def test_int8_storage_read_by_matmul_outside_the_model_is_the_culprit_and_the_layer_call_fixes_it(
        tmp_path: pathlib.Path, mode: str) -> None:
    """unsloth's GRPO logits `torch.matmul(hidden, lm_head.weight.t())` on a bitsandbytes Int8Params (hunt U21):
    the int8 storage is named, never cast; the fix computes with the layer that dequantizes it, proven on a copy."""
    pytest.importorskip("bitsandbytes")
    src = tmp_path / f"int8prog_{mode}.py"
    src.write_text(INT8_PROGRAM)
    prog = _load(src, f"int8prog_{mode}")
    torch.manual_seed(0)
    model = prog.Tiny()
    with pytest.raises(torchdoctor.PlacementError) as info, torch.no_grad(), torchdoctor.guard(model, mode=mode):
        prog.app(model)
    err = info.value
    said = str(err)
    assert said.startswith(f"dtype mismatch outside the guarded model, at int8prog_{mode}.py:17: int8 storage computed "
                           "with directly where bfloat16 was expected")
    assert "culprit lm_head.weight: i8[128,64]@cpu  (Int8Params storage: Linear8bitLt.forward dequantizes it" in said
    assert err.proof == "fix proven: the layer (Linear8bitLt) called on a copy of `hidden` gives the product's " \
                        "[2, 128] in bfloat16"
    assert err.fix == f"return lm_head(hidden)  # int8prog_{mode}.py:17"
    assert model.lm_head.weight.dtype == torch.int8  # never cast
    assert err.patch is not None
    (tmp_path / "fix.patch").write_text(err.patch)
    done = subprocess.run(["patch", "-p1", "-i", "fix.patch"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    fixed = _load(src, f"int8prog_{mode}_fixed")
    torch.manual_seed(0)
    model = fixed.Tiny()
    with torch.no_grad(), torchdoctor.guard(model, mode="strict"):
        out = fixed.app(model)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (2, 128)


class _ParentReadsHead(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        import bitsandbytes as bnb

        self.body = torch.nn.Linear(64, 64)
        self.lm_head = bnb.nn.Linear8bitLt(64, 128, bias=False, has_fp16_weights=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        return torch.matmul(h, self.lm_head.weight.t())


@pytest.mark.parametrize("mode", ["explain", "strict", "warn", "fix"])
def test_int8_storage_of_another_layer_read_in_a_forward_is_the_culprit_never_its_scale(mode: str) -> None:
    """The parent's forward reads lm_head's Int8Params directly: the int8 storage is named (never its float32 SCB
    scale, which the error's `signed char` hides), fixed by calling the layer, proven on a copy."""
    pytest.importorskip("bitsandbytes")
    torch.manual_seed(0)
    m = _ParentReadsHead()
    m.to("cpu")
    m.body.to(BF)
    with pytest.raises(torchdoctor.PlacementError) as info, torch.no_grad(), torchdoctor.guard(m, mode=mode):
        m(torch.randn(2, 64, dtype=BF))
    err = info.value
    said = str(err)
    assert said.startswith("dtype mismatch in `<root>` (_ParentReadsHead), at test_hunt_s15_guard.py:")
    assert "int8 storage computed with directly where bfloat16 was expected" in said
    assert "culprit self.lm_head.weight: i8[128,64]@cpu  (Int8Params storage, the model's `lm_head.weight`" in said
    assert "SCB" not in said
    assert err.fix is not None and err.fix.startswith("return self.lm_head(h)  # test_hunt_s15_guard.py:")
    assert err.proof == "fix proven: the layer (Linear8bitLt) called on a copy of `h` gives the product's [2, 128] " \
                        "in bfloat16"
    assert m.lm_head.weight.dtype == torch.int8


POS_PROGRAM = '''import torch
from torch import nn


class PosEmbed(nn.Module):
    def forward(self, x):
        h, w = x.shape[-2:]
        mask = torch.zeros((1, h, w), device="cuda", dtype=torch.bool)
        return (~mask).cumsum(1, dtype=torch.float32)[:, None].to(x.dtype)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch, self.pos = nn.Conv2d(3, 4, 4, 4), PosEmbed()

    def forward(self, img):
        f = self.patch(img)
        return f + self.pos(f)
'''


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine must lack the device the line asks for")
@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_a_device_written_in_a_forward_that_this_machine_lacks_is_fixed_at_its_line(
        tmp_path: pathlib.Path, mode: str) -> None:
    """sam3#587: `torch.zeros(..., device="cuda")` in a position encoding, run on a Mac or a CPU box (hunt s15 V16):
    the line is the maker, the fix the input's device there, proven by a re-run, and the diff makes it run."""
    src = tmp_path / f"posprog_{mode}.py"
    src.write_text(POS_PROGRAM)
    prog = _load(src, f"posprog_{mode}")
    model = prog.Encoder()
    with pytest.raises(Exception) as info, torch.no_grad(), torchdoctor.guard(model, mode=mode):
        model(torch.rand(1, 3, 16, 16))
    said = str(info.value)
    assert f"device problem in `pos` (PosEmbed): posprog_{mode}.py:8 asks for cuda, which this machine has none of; " \
           "the module runs on cpu" in said
    assert f"fix proven: PosEmbed runs again with 'cuda' -> x.device (cpu) at posprog_{mode}.py:8" in said
    assert f"mask = torch.zeros((1, h, w), device=x.device, dtype=torch.bool)  # posprog_{mode}.py:8" in said
    patch = said[said.index("\n    --- a/") + 1:]  # the diff as printed, four spaces in
    (tmp_path / "fix.patch").write_text("".join(x[4:] + "\n" for x in patch.splitlines()))
    done = subprocess.run(["patch", "-p1", "-i", "fix.patch"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    fixed = _load(src, f"posprog_{mode}_fixed")
    with torch.no_grad(), torchdoctor.guard(fixed.Encoder(), mode="strict"):
        assert fixed.Encoder()(torch.rand(1, 3, 16, 16)).shape == (1, 4, 4, 4)
