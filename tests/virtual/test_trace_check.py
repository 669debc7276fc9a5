"""``torch.jit.trace`` inside a virtual run (hunt T9): its own check compares the trace with a second one, as
numbers and as printed graphs. A tiny plain tensor attribute of a model copied for ``simulate(call=...)`` is a
virtual tensor with no values; printing it raised out of torch's ``_check_trace`` (a traceback in place of a report).
Both where the check prints the constant (a model copied for call=) and where it is the program's own (a block)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor


class _Offset(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.lin = nn.Linear(n, n)
        self.c = torch.arange(float(n))  # a plain attribute: traced as a constant, never moved by .to()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.c


@pytest.mark.parametrize("n", [4, 512])
def test_simulate_call_that_traces_reports_the_constant(n: int) -> None:
    def app(model: nn.Module) -> torch.Tensor:
        traced = torch.jit.trace(model.to("cuda:1"), (torch.randn(300, n, device="cuda:1"),))
        return traced(torch.randn(300, n, device="cuda:1"))

    report = torchdoctor.simulate(_Offset(n), call=app, device="cuda:1")
    assert report.problems and all(p.kind == "device" for p in report.problems), report.text()
    assert any(p.path.endswith("c") for p in report.problems)
    assert "TracingCheckError" not in report.text() and "stopped early" not in report.text()


def test_simulate_call_traced_on_the_cpu_then_moved() -> None:
    def app(model: nn.Module) -> torch.Tensor:
        traced = torch.jit.trace(model, (torch.randn(2, 4),)).to("cuda:1")
        return traced(torch.randn(2, 4, device="cuda:1"))

    report = torchdoctor.simulate(_Offset(4), call=app, device="cuda:1")
    assert any("constant of the TorchScript module" in p.message for p in report.problems), report.text()


@pytest.mark.parametrize("n", [4, 512])
def test_a_trace_in_a_block_of_a_placed_model_is_clean(n: int) -> None:
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        m = _Offset(n).to("cuda:1")
        m.c = m.c.to("cuda:1")
        traced = torch.jit.trace(m, (torch.randn(300, n, device="cuda:1"),))
        out = traced(torch.randn(300, n, device="cuda:1"))
    assert sim.ok and not sim.problems, sim.problems
    assert out.device == torch.device("cuda:1") and out.shape == (300, n)


def test_a_real_trace_check_failure_still_raises_outside_a_run() -> None:
    calls = []

    def nondeterministic(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return x + 1 if len(calls) % 2 else x * 2

    with pytest.raises(torch.jit.TracingCheckError):
        torch.jit.trace(nondeterministic, (torch.ones(2),))
