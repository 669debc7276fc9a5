"""A parameter moved by ``p.data = p.data.to("cuda:1")`` (a real tensor the run labels with its device) keeps its
device through what reads its ``.data`` again: a cast in place, ``p.data = p.data.to(torch.bfloat16)``, as
bitsandbytes' ``Linear4bit.forward`` does to its bias on every call, leaves it on cuda:1, as on the device; so does
its gradient after a backward (torch refuses a gradient elsewhere). Before, the cast put it back on the cpu, and the
next op reported a false "on cpu" problem (hunt of the twenty-sixth session, c02 and b09b)."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


def test_a_cast_of_data_moved_by_hand_stays_on_its_device() -> None:
    lin = nn.Linear(4, 4)
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as s:
        for p in lin.parameters():
            p.data = p.data.to("cuda:1")
        lin.bias.data = lin.bias.data.to(torch.bfloat16)
        assert str(lin.bias.device) == "cuda:1" and lin.bias.dtype == torch.bfloat16
        lin.bias.data = lin.bias.data.float()
        lin(torch.randn(2, 4, device="cuda:1")).sum().backward()
        assert str(lin.weight.grad.device) == "cuda:1" and str(lin.bias.grad.device) == "cuda:1"
    assert not s.problems, [p.message for p in s.problems]
    assert lin.bias.device.type == "cpu"  # the label goes with the run


def test_data_moved_by_hand_that_meets_the_cpu_is_still_a_problem() -> None:
    lin = nn.Linear(4, 4)
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as s:
        lin.weight.data = lin.weight.data.to("cuda:1")
        lin.weight.data = lin.weight.data.to(torch.float32)
        lin(torch.randn(2, 4, device="cuda:1"))  # the bias was never moved
    assert [p.path for p in s.problems] == ["bias"], [p.message for p in s.problems]
