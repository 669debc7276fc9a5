"""A forward that feeds its norm float32 on purpose (``self.norm(x.float()).to(x.dtype)``) met with the norm cast to
bf16: the fix keeps that norm in float32 and never rewrites the deliberate upcast; a bare ``.float()`` reads its dtype
from nothing (never "the class attribute TensorBase.dtype" from a ``.to(x.dtype)`` beside it on the line)."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor

BF16 = torch.bfloat16


class LayerNormBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.lin = nn.LayerNorm(8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.norm(x.float()).to(x.dtype))


class GroupBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre, self.out = nn.GroupNorm(2, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pre(x.to(torch.float32))
        return self.out(h.to(x.dtype))


def test_the_norm_fed_float32_on_purpose_is_kept_float32() -> None:
    b = LayerNormBlock().to(BF16)
    b.norm.float()
    report = torchdoctor.simulate(b, (torch.randn(2, 8, dtype=BF16),), "cuda", BF16)
    text = report.text()
    assert "TensorBase" not in text and "class attribute" not in text, text
    (fix,) = report.fixes
    assert fix.code.startswith("model.norm.float()  # `float()` at ") and "feeds norm (LayerNorm) float32 on purpose"
    assert fix.proven, fix.tried
    assert not any(f.diff for f in report.fixes)  # the program's upcast is never patched away


def test_a_group_norm_fed_by_to_float32_is_kept_too() -> None:
    report = torchdoctor.simulate(GroupBlock().to(BF16), (torch.randn(2, 8, dtype=BF16),), "cuda", BF16)
    codes = "\n".join(f.code for f in report.fixes)
    assert codes.startswith("model.pre.float()  # `to(torch.float32)` at "), codes
    assert all(f.proven for f in report.fixes), [f.tried for f in report.fixes]
