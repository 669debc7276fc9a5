"""A CPU 0-dim tensor joins an elementwise op on any device (TensorIterator treats it as a scalar), but cat and
stack copy every input into one output and refuse it ("Expected all tensors to be on the same device ... when
checking argument in method wrapper_CUDA_cat"): the rules say the same (diffusers#13450's sigmas)."""

from __future__ import annotations

import torch

import torchdoctor
from torchdoctor._rules.registry import check_all

aten = torch.ops.aten


def on(device: str, t: torch.Tensor) -> torch.Tensor:
    t._td_device = torch.device(device)  # type: ignore[attr-defined]
    return t


def test_cat_and_stack_refuse_a_cpu_scalar_elementwise_ops_take_it() -> None:
    gpu, cpu0 = on("cuda:0", torch.ones(1)), torch.tensor(2.0)
    stacked = check_all(aten.stack.default, ([on("cuda:0", torch.tensor(1.0)), cpu0],), {})
    assert [p.kind for p in stacked] == ["device"] and "cpu" in stacked[0].message
    catted = check_all(aten.cat.default, ([gpu, torch.ones(1)],), {})
    assert [p.kind for p in catted] == ["device"]
    assert check_all(aten.mul.Tensor, (on("cuda:0", torch.ones(2)), cpu0), {}) == []
    assert check_all(aten.stack.default, ([torch.tensor(1.0), cpu0],), {}) == []  # all on cpu


def test_virtual_stack_of_a_cpu_sigma_is_a_device_problem() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        sigmas = torch.ones(3, device="cuda:0")
        sigma_last = torch.tensor([0.5])  # left on the cpu
        torch.stack([sigmas[0], sigma_last[0]])
        _ = sigmas * sigma_last[0]  # a scalar there: legal
    assert [p.kind for p in sim.problems] == ["device"]
    assert "aten.stack.default runs on cuda:0" in sim.problems[0].message
