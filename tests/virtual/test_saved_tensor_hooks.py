"""Saved-tensor hooks that offload activations to the CPU (unsloth#9524 on XPU: the unpack hook moves the copy back
only with ``.cuda()`` when CUDA is available): the backward pass meets the CPU copy, and every verb names the unpack
hook at its line as the maker. Hooks that bring the copy back (``t.to(device)``, torch's ``save_on_cpu``) are quiet."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor


def pack(t: torch.Tensor) -> Any:
    return (t.device, t.to("cpu", non_blocking=True))


def unpack_cuda_only(packed: Any) -> torch.Tensor:
    dev, t = packed
    return t.cuda() if torch.cuda.is_available() else t


def unpack_back(packed: Any) -> torch.Tensor:
    dev, t = packed
    return t.to(dev, non_blocking=True)


class Net(nn.Module):
    def __init__(self, unpack: Any) -> None:
        super().__init__()
        self.a, self.b, self.unpack = nn.Linear(8, 16), nn.Linear(16, 4), unpack

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.unpack is None:
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                return self.b(torch.relu(self.a(x)))
        with torch.autograd.graph.saved_tensors_hooks(pack, self.unpack):
            return self.b(torch.relu(self.a(x)))


def step(m: nn.Module, device: str = "xpu") -> torch.Tensor:
    m.to(device, torch.bfloat16)
    x = torch.randn(2, 8, device=device, dtype=torch.bfloat16)
    m(x).float().square().mean().backward()
    return m.a.weight.grad


RETURN_LINE = unpack_cuda_only.__code__.co_firstlineno + 2
PACK_LINE = pack.__code__.co_firstlineno + 1


def _named(msg: str) -> None:
    assert "a tensor made by the saved-tensor unpack hook `unpack_cuda_only` at " in msg, msg
    assert f"test_saved_tensor_hooks.py:{RETURN_LINE} (it gives back on cpu the copy of b.weight that the pack hook " \
        f"took there with Tensor.to at " in msg, msg
    assert f"test_saved_tensor_hooks.py:{PACK_LINE})" in msg, msg
    assert "@cpu is on cpu while aten.mm.default runs on xpu:0" in msg, msg


def test_virtual_devices_finds_the_cpu_copy_and_names_the_unpack_hook() -> None:
    with torchdoctor.virtual_devices("xpu", dtype=torch.bfloat16, raise_on_exit=False) as sim:
        step(Net(unpack_cuda_only))
    assert len(sim.problems) >= 1
    _named(sim.problems[0].message)
    assert not any(p.message.startswith("b.weight") for p in sim.problems)  # the weight itself is on the device (U4)


def test_simulate_call_names_the_unpack_hook() -> None:
    report = torchdoctor.simulate(Net(unpack_cuda_only), device="xpu", dtype=torch.bfloat16, call=step)
    assert not report.ok
    _named(report.problems[0].message)


@pytest.mark.parametrize("unpack", [unpack_back, None], ids=["to_device", "save_on_cpu"])
def test_hooks_that_bring_it_back_are_quiet(unpack: Any) -> None:
    with torchdoctor.virtual_devices("xpu", dtype=torch.bfloat16, raise_on_exit=False) as sim:
        grad = step(Net(unpack))
    assert sim.problems == [], [p.message for p in sim.problems]
    assert grad is not None and grad.device == torch.device("xpu:0")


def test_hooks_outside_a_run_are_torchs_own() -> None:
    m = Net(unpack_back)
    grad = step(m, "cpu")
    assert grad is not None and grad.device.type == "cpu"
    assert torch._C._autograd._push_saved_tensors_default_hooks.__module__ != __name__.split(".")[0]
