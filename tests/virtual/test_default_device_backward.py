"""``torch.set_default_device("cuda:0")`` and a reentrant activation checkpoint (pytorch#124788): the backward pass
runs in the device's own thread, which never sees the default device, so the block's device-less ``torch.ones`` is
recomputed on the CPU and meets the activations there. Named at that line in virtual_devices and simulate; the
non-reentrant checkpoint, which enters its forward's device context again, is quiet."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import torchdoctor


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.ones(x.shape[-1])
        return torch.relu(self.fc(x)) * gate


class Net(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.block, self.head, self.reentrant = Block(), nn.Linear(8, 1), reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(checkpoint(self.block, x, use_reentrant=self.reentrant))


def step(m: nn.Module) -> torch.Tensor:
    prev = torch.get_default_device()
    torch.set_default_device("cuda:0")
    try:
        m.to("cuda:0")
        loss = m(torch.randn(4, 8, requires_grad=True)).pow(2).mean()
        loss.backward()
        return loss.detach()
    finally:
        torch.set_default_device(prev)


@pytest.fixture(autouse=True)
def _drop_device_contexts() -> Iterator[None]:
    """torch's own leak: the non-reentrant recompute enters the default device's context object again, which then
    restores cuda:0 when the program sets the default back (the same on CPU without torchdoctor)."""
    import torch.utils._device as device_mod
    from torch.overrides import _get_current_function_mode_stack, _pop_mode

    yield
    while _get_current_function_mode_stack() and isinstance(_get_current_function_mode_stack()[-1],
                                                            device_mod.DeviceContext):
        _pop_mode()
    device_mod.CURRENT_DEVICE = None


LINE = Block.forward.__code__.co_firstlineno + 1


def _named(msg: str) -> None:
    assert "a tensor made by torch.ones in `block` at " in msg and f"test_default_device_backward.py:{LINE} " in msg, msg
    assert "f32[8]@cpu is on cpu while aten.mul.Tensor runs on cuda:0" in msg, msg


def test_the_reentrant_recompute_makes_it_on_the_cpu() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        step(Net(reentrant=True))
    assert len(sim.problems) == 1, [p.message for p in sim.problems]
    _named(sim.problems[0].message)


def test_simulate_names_it_too() -> None:
    report = torchdoctor.simulate(Net(reentrant=True), device="cuda:0", call=step)
    assert not report.ok
    _named(report.problems[0].message)


@pytest.mark.parametrize("verb", ["virtual_devices", "simulate"])
def test_the_non_reentrant_checkpoint_is_quiet(verb: str) -> None:
    if verb == "simulate":
        assert torchdoctor.simulate(Net(reentrant=False), device="cuda:0", call=step).ok
        return
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        step(Net(reentrant=False))
    assert sim.problems == []
