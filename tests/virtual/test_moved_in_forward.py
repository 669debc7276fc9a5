"""A model tensor copied to another device inside a forward (``self.inv_freq.to("cpu")``) is fixed at the line that
moved it: the model's own tensor is where the move put it, and a fix that moves it again changes nothing."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


class Rotary(nn.Module):
    def __init__(self, pin: str | None) -> None:
        super().__init__()
        self.pin = pin
        self.register_buffer("inv_freq", torch.arange(4.0), persistent=False)
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        freq = self.inv_freq.to(self.pin) if self.pin else self.inv_freq.to(x.device)  # MOVED-HERE
        return self.lin(x) * freq


class Holder(nn.Module):
    """Moves its own buffer inside forward and keeps the moved one (a hook-style load): the buffer is the culprit."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(4), persistent=False)
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.scale = self.scale.to("cpu")
        return self.lin(x) * self.scale


def _line() -> str:
    with open(__file__) as f:
        return f"{__name__.rsplit('.', 1)[-1]}.py:{next(i for i, s in enumerate(f, 1) if s.rstrip().endswith('MOVED-HERE'))}"


def test_a_copy_moved_in_forward_is_fixed_at_its_line() -> None:
    model = Rotary("cpu")
    report = torchdoctor.simulate(model, (torch.randn(2, 4),), device="cuda:0")
    (p,) = [p for p in report.problems if p.kind == "device"]
    assert p.path == "inv_freq"
    assert "(a copy moved to cpu by Tensor.to at " in p.message and _line() in p.message, p.message
    assert "in `<root>`)" in p.message
    assert report.fix is not None
    assert _line() in report.fix, report.fix
    assert "moves inv_freq to cpu inside the forward" in report.fix
    assert "model.inv_freq" not in report.fix and "torchdoctor.move" not in report.fix  # moving it again: no fix
    assert model.inv_freq.device.type == "cpu" and model.pin == "cpu"  # simulate left the model as it was


def test_a_copy_moved_to_the_inputs_device_is_no_problem() -> None:
    report = torchdoctor.simulate(Rotary(None), (torch.randn(2, 4),), device="cuda:0")
    assert [p for p in report.problems if p.kind in ("device", "dtype")] == []


def test_a_moved_tensor_the_module_keeps_is_the_models_own() -> None:
    report = torchdoctor.simulate(Holder(), (torch.randn(2, 4),), device="cuda:0")
    (p,) = [p for p in report.problems if p.kind == "device"]
    assert p.path == "scale" and "a copy moved" not in p.message, p.message
    assert report.fix is not None and "moves scale" not in report.fix
