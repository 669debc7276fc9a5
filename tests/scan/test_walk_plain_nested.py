"""A transformers-style plan (a dict of names to tuples of lists of names) is proved tensor-free level by level at
C speed (``kinds._plain_nested``); anything else in such a dict is walked, so a tensor there is still found."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor._walk.kinds import MAPPING, atoms_only


class _Names(list):  # a list subclass: its own iteration could run code, so it is never proved here
    pass


@pytest.mark.parametrize(("plan", "plain"), [
    ({"lm_head": (["hidden_states"], ["logits"]),
      "model.layers": (["hidden_states", "mask"], ["hidden_states"])}, True),
    ({"a": "colwise", "b": None, "c": 3}, True),
    ({"a": ((("x",),),)}, False),  # three levels deep
    ({"a": (["x"] * 65,)}, False),  # a sequence past 64 items
    ({"a": (_Names(["x"]),)}, False),
    ({"a": ({"x"},)}, False),  # a set inside: walked, not proved here
    ({"a": ([torch.zeros(1)],)}, False),
])
def test_plans_proved(plan: dict[str, Any], plain: bool) -> None:
    assert atoms_only(plan, MAPPING, 100_000) is plain


def test_tensor_inside_a_plan_is_found() -> None:
    m = nn.Linear(2, 2)
    m._pp_plan = {"x": (["a"], [torch.zeros(3, dtype=torch.float64)])}
    report = torchdoctor.scan(m)
    assert [t.path for t in report.tensors] == ["weight", "bias", "_pp_plan.x.1.0"]
    assert [(p.kind, p.path) for p in report.problems] == [("dtype", "_pp_plan.x.1.0")]
