"""A fix strict mode prints was tried first: the failing op run again with its operands aligned as the fix says
("fix proven" / "fix unproven: tried ..."); the trial touches nothing the user holds; floating data is never cast to
an integer or float8 dtype, by the printed fix or by fix mode."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor._guard.proof import harmful, prove

BF = torch.bfloat16
MM = torch.ops.aten.mm.default


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.scale = torch.ones(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x * self.scale)


class _Stored(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randint(0, 4, (8, 8)).to(dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w


def _strict(model: nn.Module, x: torch.Tensor) -> torchdoctor.PlacementError:
    with pytest.raises(torchdoctor.PlacementError) as info:
        with torchdoctor.guard(model, mode="strict"):
            model(x)
    return info.value


def test_strict_says_the_fix_was_proven_on_the_failing_op() -> None:
    model = _Scaled().to(BF)
    err = _strict(model, torch.randn(2, 16, dtype=BF))
    # strict stops at the mul where the float32 attribute promoted the bf16 data (before the addmm that refuses it)
    assert "fix proven: aten.mul.Tensor runs with arg 1 (other) -> bfloat16" in str(err)
    assert "model.scale.data = model.scale.data.to(torch.bfloat16)" in (err.fix or "")
    assert model.scale.dtype == torch.float32  # the trial cast copies, never the model


def test_a_float8_weight_is_cast_to_the_activations_dtype_never_the_reverse() -> None:
    model = _Stored(torch.float8_e4m3fn)
    x = torch.randn(2, 8, dtype=torch.float16)
    err = _strict(model, x)
    assert "fix proven: aten.mm.default runs with arg 1 (mat2) -> float16" in str(err)
    assert (err.fix or "").splitlines() == ["model.w.data = model.w.data.to(torch.float16)"]
    with torchdoctor.guard(model, mode="fix") as g:
        assert model(x).dtype == torch.float16
    assert [(f.path, f.found, f.expected) for f in g.fixes] == [("w", "float8_e4m3fn", "float16")]


def test_a_fix_that_does_not_make_the_op_run_is_labelled_unproven_with_what_was_tried() -> None:
    x, w = torch.randn(2, 8, dtype=torch.float16), torch.randn(4, 4)
    tensors = {(0, -1): x, (1, -1): w}
    line = prove(MM, (x, w), {}, [(None, torch.float16, [(1, -1)])], tensors, MM)
    assert line.startswith("fix unproven: tried arg 1 (mat2) -> float16: RuntimeError: mat1 and mat2 shapes")
    w = torch.randn(8, 4)
    ok = prove(MM, (x, w), {}, [(None, torch.float16, [(1, -1)])], {**tensors, (1, -1): w}, MM)
    assert ok == "fix proven: aten.mm.default runs with arg 1 (mat2) -> float16"


@pytest.mark.parametrize("storage", [torch.uint8, torch.int8, torch.float8_e4m3fn, torch.bool])
def test_floating_data_is_never_cast_to_storage(storage: torch.dtype) -> None:
    x, w = torch.randn(2, 8, dtype=torch.float16), torch.ones(8, 8, dtype=storage)
    tensors = {(0, -1): x, (1, -1): w}
    plan = [(None, storage, [(0, -1)])]  # the activations to the weight's storage dtype
    assert harmful(plan, tensors)
    assert prove(MM, (x, w), {}, plan, tensors, MM).startswith("fix unproven: not tried (arg 0 (self) -> ")
    assert not harmful([(None, torch.float16, [(1, -1)])], tensors)  # the storage to the compute dtype
    assert harmful([(None, torch.float16, [])], tensors)  # nothing to align: a no-op is no fix


def test_the_trial_of_an_in_place_op_leaves_the_users_tensors_alone() -> None:
    a, b = torch.zeros(4), torch.ones(4, dtype=torch.float64)
    op = torch.ops.aten.add_.Tensor
    tensors = {(0, -1): a, (1, -1): b}
    assert prove(op, (a, b), {}, [(None, torch.float32, [(1, -1)])], tensors, op).startswith("fix proven")
    assert torch.equal(a, torch.zeros(4)) and b.dtype == torch.float64
