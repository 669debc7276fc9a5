"""A traced TorchScript module keeps a plain attribute as a constant of its code, where ``.to()`` never moves it
(sarulab-speech/Sidon#7): virtual_devices and ``run --device`` name it as the program holds it, never an all-clear,
never torch's ``data is not allocated yet``; a trace made inside the run keeps its inputs."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


class _RelPos(nn.Module):
    def __init__(self, buffer: bool = False) -> None:
        super().__init__()
        self.q = nn.Linear(4, 4)
        if buffer:
            self.register_buffer("pos_table", torch.randn(9, 4), persistent=False)
        else:
            self.pos_table = torch.randn(9, 4)  # a plain attribute: the tracer bakes it into the code

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        dist = torch.arange(n, device=x.device)
        return torch.einsum("bld,ld->bl", self.q(x), torch.embedding(self.pos_table, dist))


def _app(m: nn.Module) -> torch.Tensor:
    traced = torch.jit.trace(m.eval(), (torch.randn(1, 5, 4),), check_trace=False)  # traced on cpu
    return traced.to("cuda:0")(torch.randn(1, 5, 4, device="cuda:0"))


def test_a_trace_constant_left_on_cpu_is_named_as_the_program_holds_it() -> None:
    m = _RelPos()
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        _app(m)
    [p] = sim.problems
    assert p.kind == "device" and p.path == "m.pos_table" and (p.found, p.expected) == ("cpu", "cuda:0")
    assert "m.pos_table f32[9,4]@cpu is a constant of the TorchScript module `<root>` (TopLevelTracedModule)" \
        in p.message and "`.to()` never moves a constant" in p.message and "register it as a buffer" in p.message
    assert sim.failure is None


def test_a_trace_made_inside_the_run_keeps_its_inputs() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False):
        traced = torch.jit.trace(_RelPos(buffer=True).eval(), (torch.randn(1, 5, 4),), check_trace=False)
    [x] = [v.debugName() for v in list(traced.graph.inputs())[1:]]
    calls = [[v.debugName() for v in n.inputs()] for n in traced.graph.nodes() if n.kind() == "prim::CallMethod"]
    assert calls == [["q", x]]  # the layer is given the trace's input, not a constant the run made of it


def test_a_buffer_moves_with_the_traced_module_and_is_quiet() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        y = _app(_RelPos(buffer=True))
    assert sim.ok and not sim.problems and y.device == torch.device("cuda:0")


def test_a_module_traced_before_the_run_is_judged_too() -> None:
    traced = torch.jit.trace(_RelPos().eval(), (torch.randn(1, 5, 4),), check_trace=False)
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        traced.to("cuda:0")(torch.randn(1, 5, 4, device="cuda:0"))
    [p] = sim.problems
    assert p.path == "<root>.<constant>" and "f32[9,4]@cpu is a constant of the TorchScript module" in p.message
