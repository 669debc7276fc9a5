"""A CPU tensor the program computes from its own CPU tensors with an op that takes a list (``torch.cat([uncond,
cond])`` of conditioning parked on the cpu, InvokeAI #8850) keeps where it was made when it meets the device: one
factory's tensors keep that factory's line, several makers give the op's own line; never "made before the run"."""

from __future__ import annotations

import os
import sys

import torch
from torch import nn

import torchdoctor

HERE = os.path.relpath(__file__) if __file__.startswith(os.getcwd() + os.sep) else \
    os.sep.join(__file__.split(os.sep)[-2:])


def _message(two: bool) -> tuple[str, int, int]:
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        lin = nn.Linear(8, 8).to("cuda")
        e = torch.randn(2, 8); made = sys._getframe().f_lineno  # noqa: E702
        f = torch.randn(2, 8) if two else e
        both = torch.cat([e, f]); cat = sys._getframe().f_lineno  # noqa: E702
        lin(both)
    [p] = sim.problems
    return p.message, made, cat


def test_a_cat_of_one_factorys_tensors_keeps_the_factory_line() -> None:
    message, made, _ = _message(two=False)
    assert f"made by torch.randn at {HERE}:{made}" in message, message
    assert "before the run" not in message


def test_a_cat_of_two_makers_is_made_at_the_cat_line() -> None:
    message, _, cat = _message(two=True)
    assert f"made by Tensor.cat at {HERE}:{cat}" in message, message
    assert "before the run" not in message
