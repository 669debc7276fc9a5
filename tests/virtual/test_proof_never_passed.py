"""Tensors a forward made whose maker no record names (a product of two casts, one op past them) are never fixed as
"pass the tensors made in float32": no caller passed them. The fix says where they must be fixed instead, unproven
(the CPU dtype check of a float16 run; hunt U30's chain)."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


class Block(nn.Module):
    compute_dtype = torch.float32

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.lin(x).float()
        s = torch.ones(8).to(self.compute_dtype)
        return self.lin(g * s)


def test_a_tensor_no_caller_passed_is_never_to_be_passed() -> None:
    report = torchdoctor.simulate(Block(), (torch.randn(2, 8),), device="cpu", dtype=torch.float16)
    assert not report.ok
    text = str(report)
    assert "# pass the tensors made" not in text
    assert "float32 reached the failing op" in text and "cast them where they are made" in text
    assert not all(f.proven for f in report.fixes)
