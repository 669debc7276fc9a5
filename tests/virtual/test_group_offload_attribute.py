"""diffusers group offloading onloads a model built before or in the run by ``param.data = param.data.to(onload)``
(a real tensor given a device label): what is computed from the onloaded weight is on the onload device, so a
plain attribute the hook never moves (a quanto-style ``scale``) is found at the op that meets it, by its path, as
simulate finds it — never the onloaded weight at diffusers' own line (diffusers#12610, hunt T16)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdoctor

hooks = pytest.importorskip("diffusers.hooks")


class _QLinear(nn.Module):
    def __init__(self, buffer: bool) -> None:
        super().__init__()
        w = torch.randn(8, 8)
        scale = w.abs().amax(dim=1, keepdim=True) / 127
        if buffer:
            self.register_buffer("scale", scale, persistent=False)
        else:
            self.scale = scale  # a plain attribute: no onload moves it
        self.weight = nn.Parameter((w / scale).round().to(torch.int8), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype) * self.scale.to(x.dtype))


class _Net(nn.Module):
    def __init__(self, buffer: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_QLinear(buffer) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = x + b(x)
        return x


def _run(buffer: bool, built_before: bool) -> torchdoctor.VirtualSession:
    m = _Net(buffer) if built_before else None
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        m = m or _Net(buffer)
        hooks.apply_group_offloading(m, onload_device=torch.device("cuda:0"), offload_device=torch.device("cpu"),
                                     offload_type="block_level", num_blocks_per_group=1)
        m(torch.randn(1, 8, device="cuda:0"))
    return sim


@pytest.mark.parametrize("built_before", [False, True])
def test_the_plain_scale_is_found_at_the_mul_by_its_path(built_before: bool) -> None:
    sim = _run(buffer=False, built_before=built_before)
    assert [(p.kind, p.path, p.op, p.found) for p in sim.problems] == [
        ("device", f"blocks.{i}.scale", "aten.mul.Tensor", "cpu") for i in range(2)]
    assert all("group_offloading" not in p.message for p in sim.problems)
    assert "blocks.0.scale f32[8,1]@cpu is on cpu while aten.mul.Tensor runs on cuda:0" in sim.problems[0].message


def test_a_scale_registered_as_a_buffer_is_onloaded_and_quiet() -> None:
    sim = _run(buffer=True, built_before=False)
    assert sim.ok and not sim.problems
