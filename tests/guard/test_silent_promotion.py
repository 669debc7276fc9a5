"""Issue 42 point 3 for guard: strict reports a silent dtype promotion (a bf16 model whose forward multiplies by an
fp32 plain attribute returns fp32, with no error) by path, with a proven fix; a forward's own intended upcast is not
reported."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor

BF = torch.bfloat16


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.scale = torch.ones(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


class _Norm(nn.Module):
    """T5's norm: the variance in float32 from an upcast copy, on purpose; the result cast back."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(var + 1e-6)
        return self.weight * x.to(self.weight.dtype)


def test_an_fp32_attribute_promoting_a_bf16_model_is_reported_by_path_with_a_proven_fix() -> None:
    model = _Scaled().to(BF)
    x = torch.randn(2, 8, dtype=BF)
    assert model(x).dtype == torch.float32  # what goes unnoticed without strict
    with pytest.raises(torchdoctor.PlacementError) as info:
        with torchdoctor.guard(model, mode="strict"):
            model(x)
    err = info.value
    assert "arg 1 (other) is float32 and promotes the model's bfloat16 to float32 silently" in str(err)
    assert "culprit scale = arg 1 (other): f32[8]@cpu  (expected bfloat16)" in str(err)
    assert err.fix == "model.scale.data = model.scale.data.to(torch.bfloat16)"
    assert err.proof == "fix proven: aten.mul.Tensor runs with arg 1 (other) -> bfloat16"
    assert [(p.path, p.found, p.expected) for p in err.problems] == [("scale", "float32", "bfloat16")]
    model.scale = model.scale.to(BF)  # the fix, applied
    with torchdoctor.guard(model, mode="strict"):
        assert model(x).dtype == BF


def test_an_intended_upcast_in_forward_is_not_a_promotion_problem() -> None:
    model = nn.Sequential(nn.Linear(8, 8), _Norm()).to(BF)
    with torchdoctor.guard(model, mode="strict") as g:
        assert model(torch.randn(2, 8, dtype=BF)).dtype == BF
    assert g.problems == []
