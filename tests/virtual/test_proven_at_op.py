"""A block's fix is proven at the failing op (issue 41 point 1): the operands of the op that failed are kept as
metadata twins, the fix is applied to them as its code says, and the op runs again. Pinned for every kind of fix:
a device move, a dtype cast (a silent promotion, issue 42 point 3), a maker's fix (a factory, a cast at a line), a
tensor the program holds apart (an EMA copy, in test_rt_training_apps), and a fix that does not fix."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor._virtual.atop import prove_at_ops
from torchdoctor._virtual.prove import Fix

PROVEN = "# fix proven (at the failing op "


class Scaled(nn.Module):
    """The planted bug of issue 42: a plain fp32 attribute multiplies a bf16 model's output."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = torch.ones(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


def _scaled_block(move_scale: bool) -> tuple[torchdoctor.VirtualSession, torch.Tensor]:
    with torchdoctor.virtual_devices("cuda:0", dtype="bfloat16", raise_on_exit=False) as sim:
        m = Scaled().to("cuda:0", torch.bfloat16)
        if move_scale:
            m.scale = m.scale.to("cuda:0")
        y = m(torch.ones(2, 4, device="cuda:0", dtype=torch.bfloat16))
    return sim, y


def test_a_silent_promotion_on_the_right_device_is_a_problem_by_path_with_a_proven_cast() -> None:
    sim, y = _scaled_block(move_scale=True)
    [p] = sim.problems
    assert (p.kind, p.path, p.role, p.found, p.expected) == ("dtype", "scale", "attribute", "float32", "bfloat16")
    assert "promotes it to float32 silently" in p.message and "aten.mul.Tensor" in p.message
    assert y.dtype == torch.bfloat16  # the run goes on as if fixed
    [fix] = sim.fixes
    assert fix.code == "m.scale.data = m.scale.data.to(torch.bfloat16)"
    assert fix.proven and fix.tried.startswith("at the failing op aten.mul.Tensor at ")
    assert "its output is the one the ops after it ran on" in fix.tried
    text = str(sim.error())
    assert PROVEN + "aten.mul.Tensor at " in text and "test_proven_at_op.py:" in text
    doc = json.loads(json.dumps(sim.to_dict()))
    assert [f["proven"] for f in doc["fixes"]] == [True] and doc["problems"][0]["path"] == "scale"


def test_a_tensor_wrong_in_device_and_dtype_gets_one_proven_fix_for_both() -> None:
    sim, y = _scaled_block(move_scale=False)
    assert {(p.kind, p.path) for p in sim.problems} == {("device", "scale"), ("dtype", "scale")}
    code = [f.code for f in sim.fixes if not f.code.startswith("#")]
    assert code == ["m.scale.data = m.scale.data.to('cuda:0', torch.bfloat16)"]
    assert all(f.proven for f in sim.fixes if f.sets)
    assert y.dtype == torch.bfloat16


def test_a_device_move_is_proven_at_the_op_that_met_the_tensor() -> None:
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        m = Scaled().to("cuda:1")
        m(torch.ones(2, 4, device="cuda:1"))
    [move] = [f for f in sim.fixes if f.kind == "path"]
    assert move.code == "m.scale.data = m.scale.data.to('cuda:1')"
    assert move.proven and move.tried.startswith("at the failing op aten.mul.Tensor at ")
    assert PROVEN + "aten.mul.Tensor at " in str(sim.error())


def test_a_tensor_the_program_puts_on_the_model_later_is_judged_as_it_is_then() -> None:
    with torchdoctor.virtual_devices("cuda:0", dtype="bfloat16", raise_on_exit=False) as sim:
        m = Scaled().to("cuda:0", torch.bfloat16)
        m.scale = m.scale.to("cuda:0", torch.bfloat16)
        x = torch.ones(2, 4, device="cuda:0", dtype=torch.bfloat16)
        assert m(x).dtype == torch.bfloat16 and not sim.problems
        m.scale = torch.ones(4, device="cuda:0")  # the planted bug, after a clean forward: float32 again
        assert m(x).dtype == torch.bfloat16  # the run goes on as if fixed
        m.scale = m.scale.to(torch.bfloat16)  # the program fixes it itself: quiet from here
        m(x)
    assert [(p.kind, p.path, p.found) for p in sim.problems] == [("dtype", "scale", "float32")]


class Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + torch.zeros(4)  # the planted bug: a factory without device=


def test_a_factorys_fix_is_proven_at_the_op_its_tensor_reached() -> None:
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        Masked().to("cuda:1")(torch.ones(2, 4, device="cuda:1"))
    [fix] = [f for f in sim.fixes if f.sets]
    assert "torch.zeros" in fix.code and "device=" in fix.code
    assert fix.proven and fix.tried.startswith("at the failing op aten.add.Tensor at ")


class Upcast(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x).float()  # the planted bug: a cast to float32 inside a bf16 model
        return self.b(h)


def test_a_casts_fix_at_its_line_is_proven_at_the_op_it_broke() -> None:
    with torchdoctor.virtual_devices("cuda:0", dtype="bfloat16", raise_on_exit=False) as sim:
        Upcast().to("cuda:0", torch.bfloat16)(torch.ones(2, 4, device="cuda:0", dtype=torch.bfloat16))
    [fix] = [f for f in sim.fixes if f.sets]
    assert fix.kind == "line" and ".float()" in fix.code and "test_proven_at_op.py:" in fix.code
    assert fix.proven and "at the failing op aten.addmm.default at " in fix.tried


def test_a_fix_that_leaves_the_op_failing_is_unproven_with_what_was_still_wrong() -> None:
    sim, _ = _scaled_block(move_scale=True)
    rec = sim._rec
    wrong = Fix("model.scale.data = model.scale.data.to(torch.float16)", "path", sets=(("scale", torch.float16),))
    [out] = prove_at_ops([wrong], rec.cases.cases, rec.rules, rec.profile)
    assert not out.proven
    assert out.tried.startswith("applied to copies of the operands of aten.mul.Tensor at ")
    assert "which still found: its output is still float32, not bfloat16" in out.tried


def test_a_fix_no_failing_op_reads_is_unproven_and_says_why() -> None:
    sim, _ = _scaled_block(move_scale=True)
    rec = sim._rec
    other = Fix("model.lin.weight.data = model.lin.weight.data.to(torch.float32)", "path",
                sets=(("lin.nothing", torch.float32),))
    advice = Fix("# rebuild the optimizer after the move", "note")
    out = prove_at_ops([other, advice], rec.cases.cases, rec.rules, rec.profile)
    assert [f.proven for f in out] == [False, False]
    assert out[0].tried == "no failing op recorded reads a tensor it changes, so it was not re-run"
    assert out[1].tried.startswith("not applied: advice or program state")
    assert sim.ops > 0 and torch.cuda.is_available() is False  # nothing of the block leaks out


class Quiet(nn.Module):
    """Mixed dtypes that are no silent promotion (guard's policy): a CPU 0-dim scalar, an integer operand, a
    tensor made in forward, an autocast region."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.steps = torch.arange(4)  # int64

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x) * torch.tensor(0.5)  # a CPU 0-dim float32 scalar
        h = h + self.steps  # an integer operand
        return h * x.float().mean()  # made in forward (a per-call cast): not the model's tensor


@pytest.mark.parametrize("dtype", ["bfloat16", None])
def test_mixed_dtypes_guard_keeps_quiet_stay_quiet(dtype: str | None) -> None:
    with torchdoctor.virtual_devices("cuda:0", dtype=dtype, raise_on_exit=False) as sim:
        m = Quiet().to("cuda:0", torch.bfloat16)
        m.steps = m.steps.to("cuda:0")
        m(torch.ones(2, 4, device="cuda:0", dtype=torch.bfloat16))
    assert [(p.kind, p.path) for p in sim.problems] == []


@pytest.mark.parametrize("kind", ["cuda", "cpu"])
def test_a_promotion_in_an_autocast_region_is_autocasts_choice(kind: str) -> None:
    with torchdoctor.virtual_devices("cuda:0", dtype="bfloat16", raise_on_exit=False) as sim:
        m = Scaled().to("cuda:0", torch.bfloat16)
        m.scale = m.scale.to("cuda:0")
        with torch.autocast(kind, dtype=torch.bfloat16):
            m(torch.ones(2, 4, device="cuda:0", dtype=torch.bfloat16))
    assert sim.problems == []


def test_simulate_reports_the_promotion_by_path_with_its_fix_proven() -> None:
    m = Scaled().to(torch.bfloat16)
    m.scale = m.scale.float()
    x = torch.ones(2, 4, dtype=torch.bfloat16)
    report = torchdoctor.simulate(torchdoctor.Target(m, (x,)), device="cuda:0", dtype="bfloat16")
    assert ("dtype", "scale") in {(p.kind, p.path) for p in report.problems}
    assert [f.code for f in report.fixes if f.kind == "path"] == \
        ["model.scale.data = model.scale.data.to('cuda:0', torch.bfloat16)"]
    assert all(f.proven for f in report.fixes if f.kind == "path")
    assert m.scale.dtype == torch.float32 and m.scale.device.type == "cpu"  # the user's model untouched
