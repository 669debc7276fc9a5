"""A 0-dim tensor of another device joining an in-place op (gradients offloaded to the cpu scaled by a grad-norm
coefficient kept on cuda, NVIDIA-NeMo/Automodel PR #3461: real PyTorch raises, only a cpu 0-dim joins a device op)
is the culprit, moved to the written tensor's device at that line (``g.mul_(coef.to(g.device))``); the written
tensor is never moved, which would write a copy. A full tensor of another device read into it is the odd one out
too: the written tensor is where the program keeps its result, and the run goes on with it there."""

from __future__ import annotations

import sys

import torch

import torchdoctor


def _clip(grads: list[torch.Tensor]) -> int:
    total = torch.zeros((), device="cuda")
    for g in grads:
        total += g.to("cuda").pow(2).sum()
    coef = (1.0 / (total.sqrt() + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef); line = sys._getframe().f_lineno  # noqa: E702
    return line


def test_a_cuda_coefficient_into_a_cpu_gradient_is_moved_to_the_gradient() -> None:
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        grads = [torch.randn(4, 4, device="cuda").to("cpu") for _ in range(2)]
        before = grads[0].clone()
        _clip(grads)
    [p] = sim.problems
    assert (p.found, p.expected) == ("cuda:0", "cpu") and "f32[]@cuda:0 is on cuda:0 while aten.mul_.Tensor runs on cpu" \
        in p.message, p.message
    [fix] = [f for f in sim.fixes if f.code.startswith("g.mul_(")]
    assert fix.code.startswith("g.mul_(coef.to(g.device))") and fix.diff is not None, sim.fixes
    assert not torch.equal(grads[0], before)  # the run went on: the program's own gradient was scaled


def test_a_full_tensor_of_another_device_read_in_place_is_the_odd_one() -> None:
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        x = torch.randn(4, device="cuda").to("cpu")
        x.add_(torch.ones(4, device="cuda"))
        y = x * 2  # the program's x stays on the cpu: what follows computes there, as it would
    assert [(p.found, p.expected) for p in sim.problems] == [("cuda:0", "cpu")], sim.problems
    assert y.device.type == "cpu"
