"""A tensor ``torch.jit.trace`` baked into a module's code (a plain attribute its forward read) is reachable by no
walk and never moved by ``.to()``: scan reads the TorchScript code's constants and names one left on another device
than asked for. The printed fix (a buffer before tracing) is applied and the traced module re-run on a virtual cuda."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


class Rel(nn.Module):
    def __init__(self, as_buffer: bool) -> None:
        super().__init__()
        self.q = nn.Linear(4, 4)
        if as_buffer:
            self.register_buffer("table", torch.randn(9, 4))
        else:
            self.table = torch.randn(9, 4)  # a plain attribute: the tracer bakes it in as a constant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx = torch.arange(x.shape[1], device=x.device)
        return self.q(x) + torch.embedding(self.table, idx)


def _traced(as_buffer: bool) -> torch.jit.ScriptModule:
    return torch.jit.trace(Rel(as_buffer).eval(), (torch.randn(1, 5, 4),), check_trace=False)


def _runs_on_cuda(traced: torch.jit.ScriptModule) -> list[str]:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        traced.to("cuda:0")(torch.randn(1, 5, 4, device="cuda:0"))
    return [p.kind for p in sim.problems]


def test_a_constant_baked_on_the_cpu_is_named_and_a_buffer_before_tracing_fixes_it() -> None:
    traced = _traced(as_buffer=False)
    assert torchdoctor.scan(traced).ok  # everything on the cpu, as the constant
    report = torchdoctor.scan(traced, "cuda:0")
    (p,) = [p for p in report.problems if p.path == "<root>.<constant>"]
    assert (p.kind, p.found, p.expected) == ("device", "cpu", "cuda:0")
    assert "torch.jit.trace baked it into the code on cpu, and `.to()` never moves a constant" in p.message
    assert "register it as a buffer (self.register_buffer(...)) before tracing" in p.message
    assert "device" in _runs_on_cuda(_traced(as_buffer=False))  # what the constant does on a GPU
    fixed = _traced(as_buffer=True)  # the fix, applied
    assert [p.path for p in torchdoctor.scan(fixed, "cuda:0").problems if "<constant>" in p.path] == []
    assert _runs_on_cuda(fixed) == []
