"""The public result types write their own methods (a dataclass compiles its generated ones at import, which the
first scan of a process paid): they must behave exactly as the generated ones did. Each is compared with a twin
built by ``@dataclass`` from the same fields, with the decorator's own methods."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
import torch

import torchdoctor
from tests.support.twins import dataclass_twin
from torchdoctor import Problem, ScanReport, Target, TensorInfo


def _info(**kw: object) -> dict[str, object]:
    base = dict(path="a.weight", role="parameter", device=torch.device("cpu"), dtype=torch.bfloat16, shape=(2, 3),
                nbytes=12, moved_by_module_to=True)
    base.update(kw)
    return base


def _problem(**kw: object) -> dict[str, object]:
    base = dict(kind="dtype", path="1.bias", role="parameter", found="float64", expected="float32", message="m",
                module_path="1", module_type="Linear", tensors=("f64[4]@cpu",))
    base.update(kw)
    return base


CASES = [(TensorInfo, True, _info, {"path": "b", "alias_of": "a.weight", "shape": (3, 2)}),
         (Problem, True, _problem, {"kind": "device", "op": "aten.mm", "tensors": ()})]


@pytest.mark.parametrize("cls,frozen,make,change", CASES, ids=["TensorInfo", "Problem"])
def test_value_records_behave_as_generated(cls, frozen, make, change):
    twin = dataclass_twin(cls, frozen)
    a, b = cls(**make()), cls(**make())
    ta, tb = twin(**make()), twin(**make())
    assert repr(a) == repr(ta)
    assert (a == b) is (ta == tb) is True
    assert hash(a) == hash(b) and hash(a) == hash(tuple(getattr(a, f.name) for f in dataclasses.fields(cls)))
    assert {a, b} == {a}
    c, tc = dataclasses.replace(a, **change), dataclasses.replace(ta, **change)
    assert repr(c) == repr(tc) and type(c) is cls
    assert (a == c) is (ta == tc) is False and a != c
    assert (a == ta) is False and a.__eq__(ta) is NotImplemented  # another class: never equal, as generated
    assert a.__eq__(object()) is NotImplemented
    for name in ("path", "role"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(a, name, "x")
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(a, name)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.new_attribute = 1  # type: ignore[attr-defined]
    assert [(f.name, f.default) for f in dataclasses.fields(cls)] == [(f.name, f.default) for f in dataclasses.fields(twin)]
    assert cls.__match_args__ == twin.__match_args__
    assert dataclasses.asdict(a) == dataclasses.asdict(ta)
    assert pickle.loads(pickle.dumps(a)) == a and copy.deepcopy(a) == a and copy.copy(a) == a
    assert dataclasses.is_dataclass(a) and dataclasses.fields(cls)[0].name == dataclasses.fields(twin)[0].name
    assert cls.__module__ == "torchdoctor" and repr(a).startswith(f"{cls.__name__}(")


def test_positional_and_default_arguments_as_generated():
    info = TensorInfo("p", "buffer", torch.device("meta"), torch.float32, (1,), 4, False)
    assert info.alias_of is None and TensorInfo(*dataclasses.astuple(info)) == info
    p = Problem("meta", "x", "parameter", "meta", "cpu", "msg")
    assert (p.op, p.module_path, p.module_type, p.tensors) == (None, None, None, ())
    with pytest.raises(TypeError):
        TensorInfo("p", "buffer")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Problem(kind="meta")  # type: ignore[call-arg]


def test_target_behaves_as_generated():
    twin = dataclass_twin(Target, False)
    m = torch.nn.Linear(2, 2)
    a, ta = Target(m, (1,), {"k": 2}), twin(m, (1,), {"k": 2})
    assert repr(a) == repr(ta)
    assert a == Target(m, (1,), {"k": 2}) and a != Target(m)
    assert Target.__hash__ is None and twin.__hash__ is None
    with pytest.raises(TypeError):
        hash(a)
    d1, d2 = Target(m), Target(m)
    assert d1.kwargs == {} and d1.kwargs is not d2.kwargs  # a new dict each, as default_factory gave
    assert Target(m, kwargs=None).kwargs is None  # an explicit value is kept as given
    a.args = (3,)  # not frozen
    assert dataclasses.replace(a, obj=None).args == (3,)
    assert [f.name for f in dataclasses.fields(Target)] == ["obj", "args", "kwargs"]


def test_scan_report_behaves_as_generated():
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    m[1].bias.data = m[1].bias.data.double()
    r1, r2 = torchdoctor.scan(m), torchdoctor.scan(m)
    assert r1 == r2 and r1 is not r2
    assert r1 != dataclasses.replace(r1, source="other") and dataclasses.replace(r1, source="other").source == "other"
    with pytest.raises(TypeError):
        hash(r1)  # its dict fields make it unhashable, as the generated __hash__ did
    with pytest.raises(dataclasses.FrozenInstanceError):
        r1.source = "x"  # type: ignore[misc]
    bare = ScanReport((), ())
    assert (bare.expected, bare.extra, bare.source, bare.truncated, bare.summary, bare.verb) == ({}, {}, None, False, (), "scan")
    assert bare.expected is not ScanReport((), ()).expected
    assert [f.name for f in dataclasses.fields(ScanReport)] == ["tensors", "problems", "expected", "source", "truncated",
                                                                "summary", "extra", "verb"]
    assert pickle.loads(pickle.dumps(r1)) == r1
    assert repr(r1).startswith("<ScanReport") or "ScanReport" in repr(r1)


def test_relocation_behaves_as_generated():
    from torchdoctor._report.order import Relocation

    twin = dataclass_twin(Relocation, True)
    args = ("unet", "cpu", "cuda:0", ("a", "b"), "bfloat16", "float32")
    a, ta = Relocation(*args), twin(*args)
    assert repr(a) == repr(ta) and a == Relocation(*args) and hash(a) == hash(Relocation(*args))
    assert dataclasses.replace(a, members=("a",)) == Relocation("unet", "cpu", "cuda:0", ("a",), "bfloat16", "float32")
    assert Relocation("u", "cpu", "cuda:0", ()).dtype == "" and a.__eq__(ta) is NotImplemented
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.found = "x"  # type: ignore[misc]
