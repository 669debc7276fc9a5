"""An EMA copy (``copy.deepcopy(model).cpu()``) run on its own after the model is named as the program holds it
(``ema.backbone.weight``), never as the model's ``backbone.weight`` (NotACracker/COTR#15, hunt T18)."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

import torchdoctor


class _Det(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone, self.head = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.backbone(x)))


def _loop(keep_on_cpu: bool) -> torchdoctor.VirtualSession:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        m = _Det().to("cuda:0")
        ema = copy.deepcopy(m).requires_grad_(False)
        if keep_on_cpu:
            ema = ema.cpu()  # the bug: kept on cpu to save memory, then evaluated with cuda inputs
        m(torch.randn(2, 8, device="cuda:0")).sum().backward()
        with torch.no_grad():
            for pe, pm in zip(ema.parameters(), m.parameters()):
                pe.lerp_(pm.detach().to(pe.device), 0.01)
        ema(torch.randn(2, 8, device="cuda:0"))
    return sim


def test_the_ema_copy_is_named_as_the_program_holds_it() -> None:
    sim = _loop(keep_on_cpu=True)
    paths = {p.path for p in sim.problems}
    assert {"ema.backbone.weight", "ema.head.weight"} <= paths
    assert not paths & {"backbone.weight", "backbone.bias", "head.weight", "head.bias"}
    p = next(p for p in sim.problems if p.path == "ema.backbone.weight")
    assert p.message.startswith("ema.backbone.weight f32[16,8]@cpu is on cpu when ema.backbone (Linear) starts on cuda:0")


def test_an_ema_copy_on_the_device_is_quiet() -> None:
    sim = _loop(keep_on_cpu=False)
    assert sim.ok and not sim.problems
