"""A copy the program takes back to the CPU at its own line, outside any forward, is recorded with that line: a CPU
master copy handed to ``functional_call`` on the device (hunt W2) is named as the program holds it and fixed at the
``.cpu()`` line, proven at the op; a quantization state moved back by hand (bitsandbytes #1527's shape) and a model
moved for a save (``model.cpu().state_dict()``) say that line as their last change."""

from __future__ import annotations

import os
import io

import torch
from torch import nn

import torchdoctor

# as reports write a file: relative to the working directory when below it
HERE = os.path.relpath(__file__) if __file__.startswith(os.getcwd() + os.sep) else \
    os.sep.join(__file__.split(os.sep)[-2:])


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def test_a_cpu_master_copy_handed_to_the_forward_is_fixed_at_its_cpu_line() -> None:
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        model = _Net().to("cuda:1")
        master = {n: p.detach().cpu() for n, p in model.named_parameters()}; line = _line()  # noqa: E702
        torch.func.functional_call(model, master, (torch.randn(2, 4, device="cuda:1"),))
    weight = next(p for p in sim.problems if p.path == "lin.weight")
    assert (f"lin.weight f32[4,4]@cpu (taken to cpu by `.cpu()` at {HERE}:{line}, held as master['lin.weight']) "
            "is on cpu when lin (Linear) starts on cuda:1") in weight.message
    assert sim.sources[("device", "lin.weight", "Linear.forward", "cpu")] == (f"moved lin.weight at {HERE}:{line}",)
    fixes = [f for f in sim.fixes if f.sets]
    assert fixes and all(f.proven and f"{HERE}:{line}" in f.code for f in fixes), sim.fixes
    assert not any("torchdoctor.move(model" in f.code for f in sim.fixes)  # the model is on cuda:1 already
    assert sim.changes["lin.weight"][0] == f"on cpu since `.cpu()` at {HERE}:{line}"


def test_a_quant_state_moved_back_by_hand_keeps_the_line_as_its_last_change() -> None:
    bnb = __import__("bitsandbytes")
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        model = nn.Sequential(bnb.nn.Linear4bit(16, 16, bias=False, quant_type="nf4", compute_dtype=torch.float32))
        model[0].load_state_dict(nn.Linear(16, 16, bias=False).state_dict())
        model = model.to("cuda")
        qs = model[0].weight.quant_state
        qs.code = qs.code.cpu(); line = _line()  # noqa: E702
        model(torch.randn(2, 16, device="cuda"))
    [p] = sim.problems
    assert p.path == "0.weight.quant_state.code"
    assert f"(taken to cpu by `.cpu()` at {HERE}:{line}, held as qs.code)" in p.message
    assert sim.changes[p.path][0] == f"on cpu since `.cpu()` at {HERE}:{line}"
    assert not any(k[1] == p.path for k in sim.sources)  # the state's own fix (moved back), as before


def test_a_model_moved_for_a_save_says_the_save_line() -> None:
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)).to("cuda")
        torch.save(model.cpu().state_dict(), io.BytesIO()); line = _line()  # noqa: E702
        model(torch.randn(5, 4, device="cuda"))
    assert {p.path for p in sim.problems} >= {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert sim.changes["0.weight"][0] == f"on cpu since `.cpu()` at {HERE}:{line}"
    weight = next(p for p in sim.problems if p.path == "0.weight")
    assert f"(taken to cpu by `.cpu()` at {HERE}:{line})" in weight.message
    assert not any(s[0].startswith("moved ") for s in sim.sources.values())  # the module's own move: not a copy


def test_a_copy_made_in_a_forward_is_no_taken_back_copy() -> None:
    class Back(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.lin.weight.cpu()  # the forward's own move: said as a copy moved inside it

    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        Back().to("cuda")(torch.randn(2, 4, device="cuda"))
    assert sim.problems and not sim.changes
    assert not any("taken to cpu" in p.message for p in sim.problems)


def _line() -> int:
    import sys

    return sys._getframe(1).f_lineno
