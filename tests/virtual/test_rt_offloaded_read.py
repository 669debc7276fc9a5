"""A weight accelerate offloads (``cpu_offload``) read by the program outside its module's call is a meta placeholder
there: the run names it as the line does (``self.block.scale``) with the hook that holds its values, and keeps the
hook's-copy fix by that line for the fix writer (never ``load_state_dict``, which would undo the offload)."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor._virtual import metaread


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(8))
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class _Net(nn.Module):
    line = 0

    def __init__(self) -> None:
        super().__init__()
        self.block = _Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _Net.line = sys._getframe().f_lineno + 1
        return self.block(x) * self.block.scale  # the block's own weight, read outside its call


def test_an_offloaded_weight_read_outside_its_call_is_named_with_its_hook() -> None:
    accelerate = pytest.importorskip("accelerate")
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        net = _Net()
        accelerate.cpu_offload(net, execution_device=torch.device("cuda"))
        net(torch.randn(2, 8, device="cuda"))
    [p] = [p for p in sim.problems if p.kind == "meta"]
    assert "(`self.block.scale` f32[8]@meta: offloaded by accelerate's hook on `self.block` (_Block)" in p.message
    [source] = sim.sources[(p.kind, p.path, p.op or "", p.found)]
    assert source.startswith("offloaded at ") and source.endswith(f":{_Net.line}"), source
    culprit, fix, diff = metaread.FOUND[source]
    assert "self.block._hf_hook.weights_map['scale']" in fix and diff is not None
