"""Saved-tensor hooks in a guarded forward (hunt U13): activation offloading whose unpack hook brings the saved tensor
back only with `.cuda()` when CUDA is available leaves it on the CPU on an XPU. What the unpack hook gives back is
checked in every mode: strict raises naming the hook and its line, fix aligns it, warn aligns and warns, explain
warns. The fixed hooks (the device kept by the pack hook, `t.to(device)` on unpack) are quiet."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import torchdoctor

BF = torch.bfloat16


def pack(t):  # type: ignore[no-untyped-def]
    return (t.device, t.to("cpu"))


def unpack(packed):  # type: ignore[no-untyped-def]
    dev, t = packed
    return t.cuda() if torch.cuda.is_available() else t


def fixed_unpack(packed):  # type: ignore[no-untyped-def]
    dev, t = packed
    return t.to(dev)


def widen(t):  # type: ignore[no-untyped-def]
    return t.float()


def keep(t):  # type: ignore[no-untyped-def]
    return t


class Net(nn.Module):
    def __init__(self, hooks: tuple) -> None:  # type: ignore[type-arg]
        super().__init__()
        self.a, self.b, self.hooks = nn.Linear(8, 16), nn.Linear(16, 4), hooks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autograd.graph.saved_tensors_hooks(*self.hooks):
            return self.b(torch.relu(self.a(x)))


def _step(hooks: tuple, mode: str, device: str = "xpu") -> tuple:  # type: ignore[type-arg]
    torch.manual_seed(0)
    with torchdoctor.virtual_devices(device, raise_on_exit=False) as sim:
        m = Net(hooks).to(device, BF)
        with warnings.catch_warnings(record=True) as seen, torchdoctor.guard(m, mode=mode) as g:
            warnings.simplefilter("always")
            m(torch.randn(2, 8, device=device, dtype=BF)).float().square().mean().backward()
    told = [str(w.message) for w in seen if issubclass(w.category, torchdoctor.PlacementWarning)]
    return m, g, told, sim


def test_strict_raises_at_the_unpack_hook_that_leaves_the_saved_tensor_on_the_cpu() -> None:
    with pytest.raises(torchdoctor.PlacementError) as info:
        _step((pack, unpack), "strict")
    said = str(info.value)
    assert said.startswith("device problem during backward: the saved-tensor unpack hook `unpack` at "
                           "test_saved_tensor_hooks.py:25 gives back on cpu a tensor saved on xpu:0")
    assert "(`return t.cuda() if torch.cuda.is_available() else t`) returns bf16[" in said
    assert "return `t.to(device)` from the unpack hook (here t.to('xpu:0'))" in said
    assert info.value.proof is not None and info.value.proof.startswith("fix unproven: ")
    assert "__enter__" not in torch.autograd.graph.saved_tensors_hooks.__dict__ or \
        torch.autograd.graph.saved_tensors_hooks.__enter__.__module__ == "torch.autograd.graph"  # put back


@pytest.mark.parametrize("mode", ["fix", "warn", "explain"])
def test_fix_and_warn_align_explain_warns(mode: str) -> None:
    m, g, told, sim = _step((pack, unpack), mode)
    assert [p.message for p in g.problems] == ["the unpack hook `unpack` at test_saved_tensor_hooks.py:25 gives back "
                                               "on cpu a tensor saved on xpu:0"]
    if mode == "fix":
        assert told == [] and sim.problems == []  # aligned: the backward met xpu:0 only
    elif mode == "warn":
        assert len(told) == 1 and told[0].startswith("torchdoctor.guard: device problem during backward: the "
                                                     "saved-tensor unpack hook `unpack` at ")
        assert sim.problems == []
    else:  # explain leaves the program's tensors as they are: the run meets cpu and xpu:0
        assert len(told) == 1
        said = sim.problems[0].message
        assert "the saved-tensor unpack hook `unpack` at tests/guard/test_saved_tensor_hooks.py:25" in said
    assert m.a.weight.grad is not None


@pytest.mark.parametrize("mode", ["strict", "fix", "warn", "explain"])
def test_the_fixed_hooks_are_quiet(mode: str) -> None:
    m, g, told, sim = _step((pack, fixed_unpack), mode)
    assert g.problems == [] and told == [] and sim.problems == []
    assert m.a.weight.grad is not None and m.a.weight.grad.device.type == "xpu"


def test_a_hook_that_widens_the_saved_dtype_is_a_dtype_problem_in_strict() -> None:
    torch.manual_seed(0)
    m = Net((keep, widen)).to(BF)
    with pytest.raises(torchdoctor.PlacementError) as info, torchdoctor.guard(m, mode="strict"):
        m(torch.randn(2, 8, dtype=BF)).float().sum().backward()
    assert str(info.value).startswith("dtype problem during backward: the saved-tensor unpack hook `widen` at "
                                      "test_saved_tensor_hooks.py:34 gives back in float32 a tensor saved in bfloat16")
    assert info.value.fix == "# make `widen` at test_saved_tensor_hooks.py:34 give the tensor back in the dtype it " \
                             "was saved in (t.to(torch.bfloat16))"
