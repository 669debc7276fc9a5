"""Model tensors on meta are culprits (listed with the others, first), never under "where they surfaced"."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


class HalfLoaded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.scale = torch.ones(4)  # a plain attribute: left on cpu by Module.to
        with torch.device("meta"):
            self.b = nn.Linear(4, 4)  # never loaded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x) * self.scale)


def test_meta_weights_are_listed_with_the_culprits() -> None:
    report = torchdoctor.simulate(HalfLoaded(), (torch.randn(2, 4),), device="cuda:0")
    kinds = {(p.kind, p.path) for p in report.problems}
    assert {("meta", "b.weight"), ("meta", "b.bias"), ("device", "scale")} <= kinds
    text = str(report)
    head = text.split("where they surfaced:")[0]
    assert "b.weight" in head and "b.bias" in head and "scale" in head, text
    fix = report.fix or ""
    assert fix.index("on meta") < fix.index("model.scale"), fix  # loaded before anything is moved
