"""A silent promotion by an operand a dtype-less factory made in forward (issue 42 point 3): simulate and a block
name the factory and its line, with the dtype fix proven; the same factory given the input's dtype is quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor


class Gate(nn.Module):
    def __init__(self, typed: bool = False) -> None:
        super().__init__()
        self.lin, self.typed = nn.Linear(8, 8), typed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.typed:
            return self.lin(x) * torch.ones(x.shape[-1], device=x.device, dtype=x.dtype)
        gate = torch.ones(x.shape[-1], device=x.device)  # the maker
        return self.lin(x) * gate


def test_simulate_names_the_factory_that_promotes_the_model_dtype() -> None:
    report = torchdoctor.simulate(Gate(), (torch.randn(2, 8),), device="cuda:0", dtype=torch.bfloat16)
    assert not report.ok
    (p,) = report.problems
    assert p.kind == "dtype" and "made by torch.ones" in p.message and "promotes it to float32 silently" in p.message
    assert "test_promote_factory.py:21" in p.message
    text = str(report)
    assert "pass dtype= the input's dtype" in text and "fix proven" in text
    assert "dtype=x.dtype" in text  # the patch of the maker's line


def test_a_block_raises_on_it_and_the_typed_factory_is_quiet() -> None:
    with pytest.raises(torchdoctor.PlacementError, match=r"made by torch\.ones .* promotes it to float32 silently"):
        with torchdoctor.virtual_devices("cuda:0", dtype=torch.bfloat16):
            m = Gate().to("cuda:0", torch.bfloat16)
            m(torch.randn(2, 8, device="cuda:0", dtype=torch.bfloat16))
    assert torchdoctor.simulate(Gate(typed=True), (torch.randn(2, 8),), device="cuda:0", dtype=torch.bfloat16).ok
