"""A helper module the model keeps in a list (``self.helpers = [aux]``: ``Module.to`` never reaches it) or a plain
object holds beside the model is left on the CPU whole: the fix moves that module, once, as the program names it
(``torchdoctor.move(net.helpers[0], 'cuda:1')``), never a ``.data`` line per tensor nor a ``device=`` written into its
class's ``__init__``; proven at the failing op and by simulate's re-run, and the program moved so is quiet (hunt
W11). A module only part of which was met on the wrong device keeps the fix of that part."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


class Aux(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.register_buffer("mask", torch.ones(8))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(h) * self.mask


class Net(nn.Module):
    def __init__(self, aux: Aux) -> None:
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.helpers = [aux]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.helpers[0](self.body(x))


def test_a_helper_in_a_list_is_moved_whole_as_the_program_names_it() -> None:
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        net = Net(Aux()).to("cuda:1")
        net(torch.randn(2, 8, device="cuda:1"))
    [fix] = sim.fixes
    assert fix.code.startswith("torchdoctor.move(net.helpers[0], 'cuda:1')") and fix.proven, fix
    assert ".data" not in fix.code and fix.diff is None
    report = torchdoctor.simulate(Net(Aux()), (torch.randn(2, 8),), device="cuda:1")
    [fix] = report.fixes
    assert fix.code.startswith("torchdoctor.move(model.helpers[0], 'cuda:1')") and fix.proven, fix
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as fixed:
        net = Net(Aux()).to("cuda:1")
        torchdoctor.move(net.helpers[0], "cuda:1")
        net(torch.randn(2, 8, device="cuda:1"))
    assert fixed.ok


def test_a_module_partly_met_on_the_cpu_keeps_the_fix_of_that_part() -> None:
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        net = Net(Aux()).to("cuda:1")
        net.helpers[0].to("cuda:1")
        net.helpers[0].mask = torch.ones(8)  # a plain tensor set after the move
        net(torch.randn(2, 8, device="cuda:1"))
    codes = " ".join(f.code for f in sim.fixes)
    assert "torchdoctor.move(net.helpers[0]" not in codes and "mask" in codes, codes
