"""An activation a forward takes back to the CPU and later adds to a GPU tensor (a caching node's residual kept on
its cache device, ComfyUI-TeaCache#71): the maker is that move, at its line, and the fix is aimed there; the same
node moving the residual back (``.to(x.device)``) is quiet."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


class Cache:
    def __init__(self, model: nn.Module, back: bool) -> None:
        self.model, self.back, self.residual, self.orig = model, back, None, model.forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.residual is not None:
            return x + (self.residual.to(x.device) if self.back else self.residual)
        out = self.orig(x)
        self.residual = (out - x).to("cpu")  # kept on the cache device
        return out


def app(m: nn.Module, back: bool = False) -> torch.Tensor:
    m.to("cuda:0")
    m.forward = Cache(m, back).forward
    x = torch.randn(1, 8, device="cuda:0")
    for _ in range(2):
        x = m(x)
    return x


def test_the_move_to_the_cpu_is_the_maker_and_the_fix_is_aimed_there() -> None:
    report = torchdoctor.simulate(nn.Linear(8, 8), device="cuda:0", call=app)
    assert len(report.problems) == 1
    line = Cache.forward.__code__.co_firstlineno + 4
    msg = report.problems[0].message
    assert "a tensor made by Tensor.to in `<root>` at " in msg and f"test_taken_to_cpu.py:{line} " in msg, msg
    assert f"test_taken_to_cpu.py:{line} moves a tensor to cpu inside the forward" in str(report)


def test_moving_it_back_is_quiet() -> None:
    assert torchdoctor.simulate(nn.Linear(8, 8), device="cuda:0", call=lambda m: app(m, True)).ok
