"""Property: over tensor kinds x places x verbs, nothing but PlacementError / ValueError / TypeError (with a
message) ever leaves torchdoctor. Bounded: few examples, no deadline, each call under a hang guard."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchdoctor
from torchdoctor._move.plan import plan
from robust.kinds import PLACES, TENSORS, holder
from support.guarded import guarded

ALLOWED = (torchdoctor.PlacementError, ValueError, TypeError)
INTERNAL = ("NestedTensorImpl doesn't support", "NestedIntNode", "Please file an issue")


def _guarded(fn: Any, timeout: float = 60.0) -> Any:
    return guarded(fn, timeout)


def _forward(m: Any) -> Any:
    return m(torch.randn(2, 4))


VERBS: dict[str, Any] = {
    "scan": lambda m: torchdoctor.scan(m, device="cpu", dtype="bfloat16"),
    "plan": lambda m: plan(m, device="cpu", dtype="bfloat16"),
    "move": lambda m: torchdoctor.move(m, "cpu", "bfloat16"),
    "simulate": lambda m: torchdoctor.simulate(m, (torch.randn(2, 4),), device="cuda:0"),
    "simulate_bf16": lambda m: torchdoctor.simulate(m, (torch.randn(2, 4),), device="cuda:0", dtype="bfloat16"),
    "simulate_touch": lambda m: torchdoctor.simulate(m, device="cuda:0", call=_touch_all),
    "guard_strict": lambda m: _in_guard(m, "strict"),
    "guard_fix": lambda m: _in_guard(m, "fix"),
}


def _touch_all(copy: Any) -> None:
    """Move every tensor the walker finds and use it in one op with a bf16 scalar tensor on the device."""
    from torchdoctor._walk import walk

    for e in walk(copy).entries:
        e.tensor.to("cuda:0") * torch.ones((), dtype=torch.bfloat16, device="cuda:0")


def _in_guard(m: Any, mode: str) -> Any:
    with torchdoctor.guard(m, mode=mode):
        return _forward(m)


# verb x kind pairs that fail in code this folder's owner does not own; strict xfail turns green when fixed
KNOWN: dict[tuple[str, str], str] = {}


def _check(verb: str, kind: str, place: str) -> None:
    m, _ = holder(kind, place)
    try:
        _guarded(lambda: VERBS[verb](m))
    except ALLOWED as exc:
        text = str(exc)
        assert text.strip(), f"{verb} on {kind} in {place}: {type(exc).__name__} without a message"
        for internal in INTERNAL:  # torch's internals are not an answer for the user
            assert internal not in text, f"{verb} on {kind} in {place}: {text[:300]}"


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(verb=st.sampled_from(sorted(VERBS)), kind=st.sampled_from(sorted(TENSORS)),
       place=st.sampled_from(sorted(PLACES)))
def test_only_documented_errors_leave_torchdoctor(verb: str, kind: str, place: str) -> None:
    if (verb, kind) in KNOWN:
        return  # pinned below, as strict xfails
    _check(verb, kind, place)


@pytest.mark.parametrize(("verb", "kind"), [("plan", "nested_strided"), *(
    pytest.param(v, k, marks=pytest.mark.xfail(strict=True, reason=why)) for (v, k), why in sorted(KNOWN.items()))])
def test_strided_nested_tensors_in_plan_and_move(verb: str, kind: str) -> None:
    _check(verb, kind, "buffer")
