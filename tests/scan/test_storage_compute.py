"""Storage judged by what computes with it (issue 41 point 3): integer (GGUF-style uint8 blocks), int8 and float8
weights in a layer whose forward is torch's own are problems (that layer computes with them as they are); the same
storage behind a layer that dequantizes or casts per call is not. Before, uint8 in a plain layer was "ok" for scan
while float8 there was flagged."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdoctor

BF16 = torch.bfloat16


def _blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Our 8-bit block quantisation (uint8 codes and a per-row scale), standing in for a GGUF Q8 tensor."""
    scale = w.abs().amax(dim=-1, keepdim=True).float() / 127
    codes = (w.float() / scale).round().clamp(-127, 127).add(128).to(torch.uint8)
    return codes, scale


def dequantize_rows(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return ((codes.float() - 128) * scale.to(codes.device)).to(dtype)


class BlockLinear(nn.Linear):
    """A layer that keeps uint8 codes and dequantizes them per call (what a GGUF loader's layers do)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = dequantize_rows(self.weight, self.weight_scale, x.dtype)
        return F.linear(x, w.to(x.device), self.bias)


def _quantize_into(layer: nn.Linear, into: nn.Linear) -> nn.Linear:
    codes, scale = _blocks(layer.weight.detach())
    into.weight = nn.Parameter(codes, requires_grad=False)
    if isinstance(into, BlockLinear):  # (a plain layer has nowhere to use a scale: the codes alone were loaded)
        into.weight_scale = scale
    into.bias = layer.bias
    return into


def _model(plain: bool, conv: bool = False) -> nn.Module:
    if conv:
        m = nn.Sequential(nn.Conv3d(2, 2, 1), nn.Conv3d(2, 2, 1), nn.Conv3d(2, 2, 1)).to(BF16)
        m[1].weight = nn.Parameter(_blocks(m[1].weight.detach())[0], requires_grad=False)
        return m
    m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)).to(BF16)
    target = nn.Linear(8, 8).to(BF16) if plain else BlockLinear(8, 8).to(BF16)
    m[1] = _quantize_into(m[1], target)
    return m


@pytest.mark.parametrize("conv", [False, True])
def test_uint8_codes_in_a_plain_torch_layer_are_a_problem(conv: bool) -> None:
    m = _model(plain=True, conv=conv)
    x = torch.ones(1, 2, 1, 1, 1, dtype=BF16) if conv else torch.ones(1, 8, dtype=BF16)
    with pytest.raises(RuntimeError):
        m(x)  # the plain layer computes with the codes as they are: refused
    report = torchdoctor.scan(m)
    (p,) = report.problems
    assert (p.path, p.kind, p.found, p.expected) == ("1.weight", "dtype", "uint8", "bfloat16")
    assert "quantized integer" in p.message and "is not a dequantization" in p.message
    assert "dequantizes per call" in p.message
    assert torchdoctor.scan(m, dtype=BF16).problems[0].path == "1.weight"


def test_uint8_codes_behind_a_dequantizing_layer_are_quiet() -> None:
    m = _model(plain=False)
    assert m(torch.ones(1, 8, dtype=BF16)).dtype == BF16
    assert torchdoctor.scan(m).ok and torchdoctor.scan(m, dtype=BF16).ok
    m[2].weight = nn.Parameter(_blocks(m[2].weight.detach())[0], requires_grad=False)  # a plain one quantized too
    assert [p.path for p in torchdoctor.scan(m).problems] == ["2.weight"]


def test_int8_weight_cast_per_call_is_quiet_and_float8_in_a_plain_layer_is_named() -> None:
    class ScaledInt8(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.linear(x, self.weight.to(x.dtype) * self.scale, self.bias)

    m = nn.Sequential(nn.Linear(8, 8), ScaledInt8(8, 8), nn.Linear(8, 8)).to(BF16)
    m[1].weight = nn.Parameter(torch.ones(8, 8, dtype=torch.int8), requires_grad=False)
    m[1].scale = torch.full((8, 1), 0.5, dtype=BF16)
    assert m(torch.ones(1, 8, dtype=BF16)).dtype == BF16
    assert torchdoctor.scan(m).ok
    m[2].weight.data = m[2].weight.data.to(torch.float8_e4m3fn)
    assert [(p.path, p.found) for p in torchdoctor.scan(m).problems] == [("2.weight", "float8_e4m3fn")]


def test_move_never_casts_integer_codes_and_integer_buffers_are_not_storage() -> None:
    m = _model(plain=True)
    torchdoctor.move(m, dtype=BF16)
    assert m[1].weight.dtype == torch.uint8  # a cast of codes is not a dequantization
    assert [p.path for p in torchdoctor.scan(m).problems] == ["1.weight"]  # so it is still named
    norm = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).to(BF16)
    assert norm[1].num_batches_tracked.dtype == torch.int64 and torchdoctor.scan(norm).ok


# --- a GGUF loader's layer re-created: blocks in a tensor subclass, dequantized behind ComfyUI's cast switch --------


class QTensor(torch.Tensor):
    """uint8 blocks that remember their logical shape and scale (a GGUF loader's tensor, in a few lines)."""

    logical_shape: torch.Size
    scale: torch.Tensor

    def __new__(cls, data: torch.Tensor, shape: torch.Size, scale: torch.Tensor) -> QTensor:
        t = torch.Tensor._make_subclass(cls, data, False)
        t.logical_shape, t.scale = shape, scale
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = super().__torch_function__(func, types, args, kwargs or {})
        src = next((a for a in args if isinstance(a, QTensor)), None)
        if isinstance(out, QTensor) and src is not None and not hasattr(out, "logical_shape"):
            out.logical_shape, out.scale = src.logical_shape, src.scale
        return out


def dequantize_tensor(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if not isinstance(t, QTensor):
        return t.to(dtype)
    codes = t.as_subclass(torch.Tensor).float() - 128
    return (codes.reshape(t.logical_shape) * t.scale.to(t.device)).to(dtype)


class CastWeightBias:
    comfy_cast_weights = False  # ComfyUI's ops: the plain torch forward unless switched on

    def cast_bias_weight(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        w = dequantize_tensor(self.weight, x.dtype).to(x.device)  # type: ignore[attr-defined]
        b = self.bias  # type: ignore[attr-defined]
        return w, None if b is None else b.to(x.device, x.dtype)


class SwitchedLinear(CastWeightBias, nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.comfy_cast_weights:
            w, b = self.cast_bias_weight(x)
            return F.linear(x, w, b)
        return super().forward(x)


def _gguf_model(switch: bool) -> nn.Sequential:
    m = nn.Sequential(nn.Linear(8, 8), SwitchedLinear(8, 8), nn.Linear(8, 8)).to(BF16)
    codes, scale = _blocks(m[1].weight.detach())
    m[1].weight = nn.Parameter(QTensor(codes.flatten(), m[1].weight.shape, scale), requires_grad=False)
    m[1].comfy_cast_weights = switch  # what a GGUF loader's layer class sets
    return m


def test_gguf_style_layer_quiet_with_its_cast_on_and_named_with_the_switch_off() -> None:
    m = _gguf_model(switch=True)
    assert m(torch.ones(1, 8, dtype=BF16)).dtype == BF16
    assert torchdoctor.scan(m).ok and torchdoctor.scan(m, dtype=BF16).ok
    m[1].comfy_cast_weights = False  # the torch forward computes with the blocks as they are
    with pytest.raises(RuntimeError):
        m(torch.ones(1, 8, dtype=BF16))
    (p,) = torchdoctor.scan(m).problems
    assert (p.path, p.kind, p.found, p.expected) == ("1.weight", "dtype", "uint8", "bfloat16")
    assert "per-call cast is switched off (`comfy_cast_weights` off on this instance)" in p.message
    assert "switch the cast on" in p.message
    m[1].weight = nn.Parameter(m[1].weight.data.to(torch.float8_e4m3fn), requires_grad=False)  # float8 alike
    (p,) = torchdoctor.scan(m).problems
    assert p.found == "float8_e4m3fn" and "torch has no float8_e4m3fn math here" in p.message


def test_packed_weights_in_a_plain_layer_are_named_and_bitsandbytes_layers_are_quiet() -> None:
    bnb = pytest.importorskip("bitsandbytes")
    m = nn.Sequential(nn.Linear(8, 8), bnb.nn.Linear4bit(8, 8, compute_dtype=BF16),
                      bnb.nn.Linear8bitLt(8, 8, has_fp16_weights=False), nn.Linear(8, 8)).to(BF16).to("cpu")
    assert m[1].weight.dtype == torch.uint8 and m[2].weight.dtype == torch.int8  # packed 4-bit, int8 codes
    assert torchdoctor.scan(m).ok and torchdoctor.scan(m, dtype=BF16).ok
    assert m(torch.ones(1, 8, dtype=BF16)).dtype == BF16  # (quantized by the move, as on a GPU)
    m[3].weight = bnb.nn.Linear4bit(8, 8).to(BF16).to("cpu").weight  # packed 4-bit loaded into a plain Linear
    m[0].weight = nn.Parameter(torch.zeros(8, 1, dtype=torch.int32), requires_grad=False)  # int32-packed codes
    problems = {p.path: p for p in torchdoctor.scan(m).problems}
    assert set(problems) == {"0.weight", "3.weight"}
    assert problems["0.weight"].found == "int32" and "int32 (quantized integer) storage" in problems["0.weight"].message
    assert "packed 4-bit storage but Linear's own forward" in problems["3.weight"].message


# --- a layer of the model's own code: judged by what its forward hands to torch's compute functions ---------------


class DirectLinear(nn.Module):
    """A model's own layer that computes with its weight as it is (no cast anywhere in its forward)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(weight.shape[0], dtype=BF16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class CastingLinear(DirectLinear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype), self.bias)


class Lookup(nn.Module):
    """Integer codes used as the indices of an embedding lookup: what an integer tensor is for."""

    def __init__(self) -> None:
        super().__init__()
        self.codes = nn.Parameter(torch.tensor([0, 3]), requires_grad=False)
        self.table = nn.Parameter(torch.ones(8, 8, dtype=BF16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.embedding(self.codes, self.table).sum(0)


@pytest.mark.parametrize("dt", [torch.uint8, torch.float8_e4m3fn])
def test_a_custom_layer_handing_its_storage_to_f_linear_is_named_and_one_that_casts_is_quiet(dt: torch.dtype) -> None:
    codes = torch.ones(8, 8).to(dt)
    m = nn.Sequential(nn.Linear(8, 8), DirectLinear(codes), nn.Linear(8, 8), Lookup()).to(BF16)
    m[1].weight = nn.Parameter(codes, requires_grad=False)  # loaded after the cast, as a loader does
    with pytest.raises(RuntimeError):
        m(torch.ones(1, 8, dtype=BF16))  # computed with the storage as it is
    (p,) = torchdoctor.scan(m).problems
    assert (p.path, p.kind, p.found, p.expected) == ("1.weight", "dtype", str(dt).removeprefix("torch."), "bfloat16")
    assert "DirectLinear's own forward computes with it as it is" in p.message
    m[1] = CastingLinear(codes)
    assert m(torch.ones(1, 8, dtype=BF16)).dtype == BF16
    assert torchdoctor.scan(m).ok and torchdoctor.scan(m, dtype=BF16).ok


class BranchingLinear(DirectLinear):
    """transformers' FP8Linear's shape: ``F.linear`` on the weight only when it is no longer 1-byte storage, a
    dequantizing path otherwise. The branch reads the weight's own storage, so the call under it is not a use of it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.element_size() > 1:
            return F.linear(x, self.weight, self.bias)
        return F.linear(x, self.weight.to(x.dtype) * 0.5, self.bias)


@pytest.mark.parametrize("dt", [torch.uint8, torch.float8_e4m3fn])
def test_a_call_under_a_test_of_the_weights_own_storage_is_not_computing_in_it(dt: torch.dtype) -> None:
    codes = torch.ones(8, 8).to(dt)
    m = nn.Sequential(nn.Linear(8, 8), BranchingLinear(codes), nn.Linear(8, 8)).to(BF16)
    m[1].weight = nn.Parameter(codes, requires_grad=False)
    assert m(torch.ones(1, 8, dtype=BF16)).dtype == BF16  # the dequantizing branch runs
    assert torchdoctor.scan(m).ok and torchdoctor.scan(m, dtype=BF16).ok
    m[1] = DirectLinear(codes)  # the same layer without the branch is still named
    assert [p.path for p in torchdoctor.scan(m).problems] == ["1.weight"]
