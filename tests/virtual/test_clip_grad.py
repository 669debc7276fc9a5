"""A correct training step with ``clip_grad_norm_`` and a foreach optimizer is quiet on a virtual GPU: torch groups
their tensors by device in C++, which reads a virtual tensor's inner (meta) device, so the groups are keyed by the
device the program sees (the clip coefficient once met the gradients as a meta tensor: a false problem)."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


def step(m: nn.Module) -> torch.Tensor:
    m.to("cuda:0")
    opt = torch.optim.AdamW(m.parameters(), foreach=True)
    loss = m(torch.randn(2, 8, device="cuda:0")).sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    return loss


def test_clip_grad_norm_and_a_foreach_step_are_quiet() -> None:
    report = torchdoctor.simulate(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)), device="cuda:0", call=step)
    assert report.ok, report.problems
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        step(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)))
    assert sim.problems == []


def test_the_grouping_keys_are_the_programs_devices() -> None:
    from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype

    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False):
        a, b = torch.ones(2, device="cuda:0"), torch.ones(3, device="cuda:0", dtype=torch.float16)
        keys = set(_group_tensors_by_device_and_dtype([[a, b]]))
    assert keys == {(torch.device("cuda:0"), torch.float32), (torch.device("cuda:0"), torch.float16)}
    assert torch._C._group_tensors_by_device_and_dtype.__name__ == "_group_tensors_by_device_and_dtype"  # put back
