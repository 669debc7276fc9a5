"""``torch.jit.trace`` bakes what it met into the code: a plain tensor attribute becomes a constant on the device it
was traced on, and a factory records the device it ran on (``torch.arange(n)`` -> ``device=cpu``). Moved to a GPU,
both meet the inputs on the device and the real forward raises. A constant is one finding (its op is not a second
one); a factory recorded on the cpu is found in a virtual run too, where the op
alone cannot tell its CPU tensor from one made like the inputs. Traces that place their tensors right stay quiet."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


class _Constant(nn.Module):
    def __init__(self, buffer: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        if buffer:
            self.register_buffer("pos", torch.arange(4.0))
        else:
            self.pos = torch.arange(4.0)  # a plain attribute: traced as a constant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.pos


class _Made(nn.Module):
    def __init__(self, on_input: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.on_input = on_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.zeros_like(x).add(1) if self.on_input else torch.arange(4.0)  # zeros_like: traced as made
        return self.lin(x) + pos  # from x, wherever x is


def _run(module: nn.Module) -> list[torchdoctor.Problem]:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        m = torch.jit.trace(module, torch.randn(2, 4)).to("cuda")
        m(torch.randn(2, 4, device="cuda"))
    return list(sim.problems)


def test_a_traced_constant_is_one_finding() -> None:
    found = _run(_Constant())
    assert len(found) == 1, [p.message for p in found]
    assert (found[0].kind, found[0].found, found[0].expected) == ("device", "cpu", "cuda:0")
    assert "torch.jit.trace baked it into the code on cpu" in found[0].message


def test_a_factory_the_trace_recorded_on_the_cpu_is_found_in_a_run() -> None:
    found = _run(_Made())
    assert len(found) == 1, [p.message for p in found]
    p = found[0]
    assert p.path == "<root>.<arange at test_rt_traced.py:35>"
    assert "torch.jit.trace recorded the device it ran on" in p.message
    assert "device=x.device and .to(x) are recorded as the constants they were too" in p.message


def test_traces_that_place_their_tensors_stay_quiet() -> None:
    assert _run(_Constant(buffer=True)) == []
    assert _run(_Made(on_input=True)) == []
