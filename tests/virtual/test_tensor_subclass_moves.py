"""A program's own ``torch.Tensor`` subclass (a GGUF loader's quantized tensor made with ``_make_subclass``, holding
its logical shape and scale as attributes) keeps its class and attributes through a virtual ``.to``, as torch's
does: a layer that dequantizes it per call runs under ``virtual_devices`` / ``simulate`` and stays quiet; the same
integer codes in a plain layer are still named."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import torchdoctor

BF16 = torch.bfloat16


class Codes(torch.Tensor):
    """uint8 codes that remember their shape and scale (our few-line stand-in for a GGUF tensor)."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, shape: torch.Size, scale: torch.Tensor) -> Any:
        t = torch.Tensor._make_subclass(cls, data, False)
        t.logical_shape, t.scale = shape, scale
        return t

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = super().__torch_function__(func, types, args, kwargs or {})
        src = next((a for a in args if isinstance(a, Codes)), None)
        if isinstance(out, Codes) and src is not None and not hasattr(out, "logical_shape"):
            out.logical_shape, out.scale = src.logical_shape, src.scale
        return out


class Dequant(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if isinstance(w, Codes):  # dequantized per call, to the input's dtype and device
            w = ((w.as_subclass(torch.Tensor).float() - 128).reshape(w.logical_shape) * w.scale.to(x.device)).to(x.dtype)
        return F.linear(x, w, self.bias)


def _model() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), Dequant(8, 8), nn.Linear(8, 8)).to(BF16)
    w = m[1].weight.detach()
    scale = w.abs().amax(dim=-1, keepdim=True).float() / 127
    codes = (w.float() / scale).round().clamp(-127, 127).add(128).to(torch.uint8).flatten()
    m[1].weight = nn.Parameter(Codes(codes, w.shape, scale), requires_grad=False)
    return m


def test_a_dequantized_per_call_subclass_keeps_its_class_through_a_virtual_move_and_is_quiet() -> None:
    m = _model()
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        m.to("cuda:1")
        w = m[1].weight
        assert isinstance(w, Codes) and w.logical_shape == (8, 8) and w.scale.shape == (8, 1)
        assert m(torch.ones(1, 8, dtype=BF16, device="cuda:1")).dtype == BF16
    assert sim.problems == []
    assert torchdoctor.simulate(_model(), (torch.ones(1, 8, dtype=BF16),), "cuda:1").ok


def test_the_same_codes_in_a_plain_layer_are_still_named() -> None:
    m = _model()
    m[1] = nn.Linear(8, 8).to(BF16)
    m[1].weight = nn.Parameter(torch.zeros(8, 8, dtype=torch.uint8), requires_grad=False)
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        m.to("cuda:1")
        m(torch.ones(1, 8, dtype=BF16, device="cuda:1"))
    assert [(p.kind, p.path) for p in sim.problems if p.kind == "dtype"][:1] == [("dtype", "1.weight")], sim.problems
