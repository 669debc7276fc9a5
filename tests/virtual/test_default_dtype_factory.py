"""A factory in a forward given no dtype, or ``dtype=None`` (the same: the default float32), promotes a bfloat16
model silently; simulate names it, on a virtual GPU and on the CPU itself, at its line, with the fix at that call.
A factory told ``dtype=torch.float32`` is the code's choice, as guard's policy says: quiet on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor


class Scaled(nn.Module):
    def __init__(self, dtype: object = "unset") -> None:
        super().__init__()
        self.lin, self.dt = nn.Linear(4, 4), dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dt == "unset":
            return self.lin(x) * torch.ones(4, device=x.device)
        return self.lin(x) * torch.ones(4, dtype=self.dt, device=x.device)


@pytest.mark.parametrize("given", ["unset", None], ids=["no dtype", "dtype=None"])
@pytest.mark.parametrize("device", ["cuda:0", "cpu"])
def test_a_default_dtype_factory_is_named_as_the_promoting_maker(given: object, device: str) -> None:
    report = torchdoctor.simulate(Scaled(given), (torch.randn(2, 4),), device=device, dtype=torch.bfloat16)
    assert len(report.problems) == 1, report.problems
    p = report.problems[0]
    assert p.kind == "dtype" and p.found == "float32" and p.expected == "bfloat16"
    assert p.message.startswith("a tensor made by torch.ones in `<root>` at ") and "test_default_dtype_factory.py:" in p.message
    assert "promotes" in p.message
    assert "torch.ones(..., dtype=x.dtype)" in str(report)  # the fix at that call, the input's dtype


def test_a_factory_told_float32_is_the_codes_choice_on_the_cpu() -> None:
    assert torchdoctor.simulate(Scaled(torch.float32), (torch.randn(2, 4),), device="cpu", dtype=torch.bfloat16).ok
