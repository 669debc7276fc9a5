"""A plain tensor attribute of a ``torch.jit.script`` module (``self.scale = torch.ones(4)``) is never moved by
``.to()``: the scripted code meets it on the CPU. Judged when the module starts, named as the program holds it
(``scripted.scale``), in virtual_devices and simulate; a buffer, or an attribute the code moves itself, is quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(4, 4)
        self.scale = torch.ones(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(x) * self.scale


class Buffer(Plain):
    def __init__(self) -> None:
        super().__init__()
        del self.scale
        self.register_buffer("scale", torch.ones(4))


class MovesIt(Plain):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.scale
        return self.q(x) * s.to(x.device)


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Plain()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def run(scripted: nn.Module) -> torch.Tensor:
    scripted.to("cuda:0")
    return scripted(torch.randn(2, 4, device="cuda:0"))


@pytest.mark.parametrize("build, name", [(Plain, "scripted.scale"), (Outer, "scripted.inner.scale")])
def test_a_plain_attribute_of_a_scripted_module_is_named(build, name) -> None:
    scripted = torch.jit.script(build())  # scripted before the run, as a program loads it
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        run(scripted)
    [p] = sim.problems
    assert p.kind == "device" and p.path == name and (p.found, p.expected) == ("cpu", "cuda:0")
    assert f"{name} f32[4]@cpu is a plain tensor attribute of the TorchScript module `<root>` " \
           "(RecursiveScriptModule): `.to()` moves only parameters and buffers" in p.message, p.message
    assert "self.register_buffer('scale', ...)" in p.message


def test_scripted_inside_simulate_is_named_too() -> None:
    report = torchdoctor.simulate(Plain(), device="cuda:0", call=lambda m: run(torch.jit.script(m)))
    assert not report.ok
    assert any("is a plain tensor attribute of the TorchScript module" in p.message for p in report.problems), \
        str(report)


@pytest.mark.parametrize("build", [Buffer, MovesIt])
def test_a_buffer_or_an_attribute_the_code_moves_is_quiet(build) -> None:
    scripted = torch.jit.script(build())
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        y = run(scripted)
    assert sim.problems == [] and y.device == torch.device("cuda:0")
