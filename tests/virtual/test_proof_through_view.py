"""A block's dtype fix of a caller's argument proven where the failing op reads a view of it: ``x[:, 0]``,
``x.view(...)``, ``x.transpose(...)``, a linear's own ``x.view(-1, n)`` of a 3-d input. Ops that keep a dtype carry
a cast of the argument unchanged to the view, so the cast is applied to the argument and carried through them to
the operand, and the failing op runs on it: "fix proven", saying what it was carried through. An argument that
reaches the op through ops that compute (``x * 2 + 1``; a product with a float32 table would promote the cast back)
stays unproven, with what was tried."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor


class _Net(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.fc, self.how = nn.Linear(8, 4), how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "x[:, 0]":
            return self.fc(x[:, 0])
        if self.how == "x.view(-1, 8)":
            return self.fc(x.view(-1, 8))
        if self.how == "x.transpose(0, 1)":
            return self.fc(x.transpose(0, 1))
        if self.how == "x * 2 + 1":
            return self.fc(x * 2 + 1)
        return self.fc(x)  # a 3-d input: the linear views it itself


def _fixes(how: str) -> list[object]:
    x = torch.randn(2, 3, 8)  # made before the block: the caller's argument, with no maker in the block
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        net = _Net(how).to("cuda", torch.bfloat16)
        net(x.to("cuda"))
    assert sim.problems and {p.kind for p in sim.problems} == {"dtype"}, sim.problems
    return list(sim.fixes)


@pytest.mark.parametrize("how, ops", [("x[:, 0]", "aten.select"), ("x.view(-1, 8)", "aten.view"),
                                      ("x.transpose(0, 1)", "aten.transpose"), ("3-d input", "aten.view")])
def test_a_cast_of_the_argument_is_proven_through_the_view(how: str, ops: str) -> None:
    [fix] = _fixes(how)
    assert fix.code == "# pass input 0 (x) as tensor.to(torch.bfloat16)", fix.code  # type: ignore[attr-defined]
    assert fix.proven, fix.tried  # type: ignore[attr-defined]
    assert fix.tried.startswith("at the failing op aten.") and "run with no problem" in fix.tried  # type: ignore
    assert f"; the cast of input 0 (x) carried through {ops}" in fix.tried, fix.tried  # type: ignore[attr-defined]


def test_an_argument_computed_on_stays_unproven_saying_so() -> None:
    [fix] = _fixes("x * 2 + 1")  # the ops between compute: only a re-run of the program proves the cast
    assert fix.code == "# pass input 0 (x) as tensor.to(torch.bfloat16)", fix.code  # type: ignore[attr-defined]
    assert not fix.proven and "carried through" not in fix.tried, fix.tried  # type: ignore[attr-defined]
    assert fix.tried.startswith("it changes input 0 (x), which reaches the failing op only through other ops"), \
        fix.tried  # type: ignore[attr-defined]
