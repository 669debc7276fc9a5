"""``torch.cat`` / ``torch.stack`` of a list that mixes the model's dtype with float32 promotes silently, as
``bf16 * fp32`` does: strict raises it (inside a module, and in the code around the model, whose first stage looks
into a call's list of tensors), naming the float32 tensor's maker; fix aligns it inside the model; one dtype is
quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor import PlacementError


class Joins(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.extra = torch.zeros(2, 4)  # a plain attribute: .to(bfloat16) leaves it float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.lin(x), self.extra])


def test_a_join_inside_the_model_that_promotes_is_raised_by_strict() -> None:
    m = Joins().to(torch.bfloat16)
    with pytest.raises(PlacementError) as info, torch.no_grad(), torchdoctor.guard(m, mode="strict"):
        m(torch.randn(2, 4, dtype=torch.bfloat16))
    text = str(info.value)
    assert "at aten.cat.default" in text and "promotes the model's bfloat16 to float32 silently" in text, text
    assert "extra" in (info.value.fix or ""), text


def test_a_join_around_the_model_names_its_maker() -> None:
    m = nn.Linear(4, 4).to(torch.bfloat16)
    with pytest.raises(PlacementError) as info, torch.no_grad(), torchdoctor.guard(m, mode="strict"):
        y = m(torch.randn(2, 4, dtype=torch.bfloat16))
        extra = torch.zeros(2, 4)  # float32, made around the model
        torch.stack([y, extra])
    e = info.value
    assert "code outside any module at aten.stack.default" in str(e), str(e)
    assert "made by `torch.zeros` at " in str(e) and e.fix is not None and "dtype=torch.bfloat16" in e.fix, str(e)


def test_fix_aligns_a_join_inside_the_model() -> None:
    m = Joins().to(torch.bfloat16)
    with torch.no_grad(), torchdoctor.guard(m, mode="fix") as g:
        out = m(torch.randn(2, 4, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16 and [f.op for f in g.report().fixes] == ["aten.cat.default"]


def test_a_join_of_one_dtype_is_quiet() -> None:
    m = nn.Linear(4, 4).to(torch.bfloat16)
    with torch.no_grad(), torchdoctor.guard(m, mode="strict") as g:
        y = m(torch.randn(2, 4, dtype=torch.bfloat16))
        out = torch.cat([y, torch.zeros(2, 4, dtype=torch.bfloat16)])
    assert out.dtype == torch.bfloat16 and not g.report().problems
