"""``PlanStep`` and ``MoveReport`` behave as the frozen dataclasses they were declared as (issue 28: their methods are
written by hand, so that importing move compiles nothing): ``fields``, ``replace``, ``asdict``, equality, hashing,
frozenness, ``repr`` and pickling, pinned against what ``@dataclass(frozen=True)`` gives a class of the same fields."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
from dataclasses import FrozenInstanceError, dataclass
from typing import Any

import pytest
import torch

from torchdoctor._move.plan import MoveReport, Moved, PlanStep


@dataclass(frozen=True)
class RefStep:  # what PlanStep was declared as
    path: str
    role: str
    found: str
    expected: str
    via: str


@dataclass(frozen=True, repr=False)
class RefReport:  # what MoveReport was declared as (without its __post_init__ conversions)
    moved: tuple
    device: Any
    dtype: Any
    kept: tuple = ()
    storage_bytes: int = 0
    seconds: float = 0.0
    problems: tuple = ()
    optimizers: tuple = ()  # HeldBy rows: the optimizers whose state moved with the parameters (issue 39)
    notes: tuple = ()
    missed: tuple = ()  # the moved paths Module.to would have missed (issue 42 point 10)


STEP = ("0.weight", "parameter", "f32[2,2]@cpu", "bf16[2,2]@cpu", "param.data")
ROWS = (Moved("0.weight", "f32[2,2]@cpu", "bf16[2,2]@cpu", 8),)


def report(**kw: Any) -> MoveReport:
    args: dict[str, Any] = {"moved": ROWS, "device": torch.device("meta"), "dtype": torch.bfloat16,
                            "kept": (("n.weight", "_keep_in_fp32_modules"),), "storage_bytes": 8, "seconds": 0.5}
    args.update(kw)
    return MoveReport(**args)


def test_fields_are_those_of_the_declared_dataclasses() -> None:
    assert dataclasses.is_dataclass(PlanStep) and dataclasses.is_dataclass(MoveReport)
    assert [f.name for f in dataclasses.fields(PlanStep)] == [f.name for f in dataclasses.fields(RefStep)]
    assert [f.name for f in dataclasses.fields(MoveReport)] == [f.name for f in dataclasses.fields(RefReport)]
    defaults = {f.name: f.default for f in dataclasses.fields(MoveReport)}
    assert defaults["kept"] == () and defaults["storage_bytes"] == 0 and defaults["seconds"] == 0.0
    assert defaults["problems"] == () and defaults["moved"] is dataclasses.MISSING
    assert list(inspect.signature(PlanStep).parameters) == list(inspect.signature(RefStep).parameters)
    assert list(inspect.signature(MoveReport).parameters) == list(inspect.signature(RefReport).parameters)
    assert PlanStep.__match_args__ == RefStep.__match_args__
    assert MoveReport.__match_args__ == RefReport.__match_args__


def test_plan_step_equality_hash_repr_replace_as_a_dataclass() -> None:
    s, ref = PlanStep(*STEP), RefStep(*STEP)
    assert repr(s) == repr(ref).replace("RefStep", "PlanStep")
    assert s == PlanStep(*STEP) and hash(s) == hash(PlanStep(*STEP)) == hash(ref)
    assert s != PlanStep(*STEP[:-1], "assign") and s != ref and s != STEP  # another class is never equal
    assert s.__eq__(STEP) is NotImplemented
    assert len({s, PlanStep(*STEP), PlanStep(*STEP[:-1], "assign")}) == 2
    r = dataclasses.replace(s, via="assign")
    assert isinstance(r, PlanStep) and r.via == "assign" and r.path == s.path and s.via == "param.data"
    assert dataclasses.asdict(s) == dataclasses.asdict(ref) == s.to_dict()
    assert dataclasses.astuple(s) == STEP
    assert PlanStep(path="p", role="r", found="f", expected="e", via="v") == PlanStep("p", "r", "f", "e", "v")
    with pytest.raises(TypeError):
        PlanStep(*STEP[:-1])  # type: ignore[call-arg]
    match s:
        case PlanStep(path, role):
            assert (path, role) == STEP[:2]


@pytest.mark.parametrize("make", [lambda: PlanStep(*STEP), report], ids=["PlanStep", "MoveReport"])
def test_frozen(make: Any) -> None:
    obj = make()
    name = "path" if isinstance(obj, PlanStep) else "seconds"
    with pytest.raises(FrozenInstanceError, match=f"cannot assign to field '{name}'"):
        setattr(obj, name, "x")
    with pytest.raises(FrozenInstanceError, match="cannot assign to field 'other'"):
        obj.other = 1  # no new attributes either, as a frozen dataclass
    with pytest.raises(FrozenInstanceError, match=f"cannot delete field '{name}'"):
        delattr(obj, name)
    assert isinstance(FrozenInstanceError(), AttributeError)
    assert copy.copy(obj) == obj and copy.deepcopy(obj) == obj
    assert pickle.loads(pickle.dumps(obj)) == obj


def test_move_report_equality_hash_replace_and_conversions() -> None:
    a = report()
    assert a == report() and hash(a) == hash(report())
    assert hash(a) == hash(RefReport(ROWS, torch.device("meta"), torch.bfloat16, (("n.weight", "_keep_in_fp32_modules"),),
                                     8, 0.5))
    assert a != report(seconds=0.6) and a != report(problems=("p",)) and a.__eq__(1) is NotImplemented
    b = dataclasses.replace(a, seconds=1.0)
    assert isinstance(b, MoveReport) and b.seconds == 1.0 and b.moved == a.moved and a.seconds == 0.5
    # __post_init__'s conversions: strings to torch objects, lists to tuples
    c = MoveReport([ROWS[0]], "meta", "bf16", kept=[("x", "y")])
    assert c.device == torch.device("meta") and c.dtype == torch.bfloat16 and c.moved == ROWS
    assert c.kept == (("x", "y"),) and isinstance(c.moved, tuple)
    assert MoveReport((), None, None).device is None and MoveReport((), None, None).ok
    assert dataclasses.asdict(a)["storage_bytes"] == 8


def test_move_report_repr_is_the_one_line_view() -> None:
    text = repr(report())
    assert text.startswith("<MoveReport") and "1 moved" in text and "1 kept" in text and len(text) < 240
    assert str(report()).startswith("moved 1 tensor(s), 8 B, to meta bfloat16")


def test_optimizer_rows_and_notes_survive_pickling_and_reach_the_json() -> None:
    from torchdoctor._move.plan import HeldBy

    held = HeldBy("Adam", "optimizer", 6, 12, True)
    r = report(optimizers=[held], notes=["could not look"])
    assert r.optimizers == (held,) and r.notes == ("could not look",)
    assert pickle.loads(pickle.dumps(r)) == r and copy.deepcopy(r) == r
    doc = r.to_dict()
    assert doc["optimizers"] == [{"name": "Adam", "path": "optimizer", "params": 6, "moved": 12, "found": True}]
    assert doc["notes"] == ["could not look"]
    assert str(r).splitlines()[-2:] == [
        "optimizer Adam holds 6 of these parameters (found by move); its state was moved with them (12 tensor(s))",
        "could not look"]
