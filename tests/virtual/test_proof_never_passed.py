"""Tensors a forward made are never fixed as "pass the tensors made in float32": no caller passed them. A product
of two casts one op past them (``self.lin(x).float()`` times ``torch.ones(8).to(self.compute_dtype)``) names both
makers — the second a cast to the dtype its tensor already had, which still chose it — and fixes both, proven by the
CPU dtype check's re-run (a float16 run; hunt U30's chain)."""

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


def test_a_tensor_no_caller_passed_is_fixed_at_each_of_its_makers() -> None:
    report = torchdoctor.simulate(Block(), (torch.randn(2, 8),), device="cpu", dtype=torch.float16)
    [problem] = report.problems
    assert "a tensor made from `float()` at " in problem.message and "`to(self.compute_dtype)` at " in problem.message
    text = str(report)
    assert "# pass the tensors made" not in text and "no line that made them" not in text
    codes = [f.code for f in report.fixes]
    assert any("`g = self.lin(x).float()` casts to float32" in c for c in codes), codes
    assert "model.compute_dtype = torch.float16" in " ".join(codes)
    assert report.fixes and all(f.proven for f in report.fixes)
