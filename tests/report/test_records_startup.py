"""The records a virtual run imports before the program's first line write their own methods (the dataclass
decorator compiles each generated method with ``exec`` at import, ~0.5 ms a class: issue 43 point 4). Each behaves
as the generated class did: compared with a twin the decorator makes from the same fields."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import weakref

import pytest
import torch

from torchdoctor._rules.profile import DeviceProfile
from torchdoctor._rules.registry import Finding, Rule
from torchdoctor._report.model import Problem
from torchdoctor._trace.record import TraceRecord
from torchdoctor._virtual.apart import Apart
from torchdoctor._virtual.castsites import CastSite
from tests.support.twins import dataclass_twin


def _check(x: object) -> None:
    return None


_M = torch.nn.Linear(2, 2)
_TRACE = dict(path="0.weight", kind="move", from_device="cpu", from_dtype="float32", to_device="cuda:0",
              to_dtype="bfloat16", call="to()", qualname="Linear.to", via="Module._apply", file="/x/app.py", line=3,
              time=1.5)
_PROBLEM = Problem("dtype", "1.bias", "parameter", "float64", "float32", "m")
FROZEN = [
    (TraceRecord, _TRACE, {"shape": (2, 2), "lora": True, "thread": "t"}, {"path": "1.bias"}),
    (Finding, dict(problem=_PROBLEM, attr="dtype", target=torch.float32, offenders=((0, -1),)),
     {"considered": ((1, -1),), "fixed": True}, {"attr": "device"}),
    (Rule, dict(family="mm", ops=("aten.mm",), device="same", dtype=_check), {"support": "matmul", "uniform_too": True},
     {"device": "copy"}),
    (DeviceProfile, dict(type="cuda", count=2), {"capability": (7, 5), "name": "T4",
                                                 "unsupported_dtypes": frozenset({"float64"})}, {"count": 3}),
]
MUTABLE = [
    (CastSite, dict(at="app.py:3", file="/x/app.py", lineno=3, text="h.float()", cast="float()", dtype=torch.float32),
     {"read_from": "the config c.dtype", "attr": "dtype", "module": weakref.ref(_M)}, {"lineno": 4}),
    (Apart, dict(cls="CN", module=weakref.ref(_M)), {"name": "self._cn", "called_at": "app.py:9", "file": "/x/app.py",
                                                     "line": 7, "prefix": "p."}, {"name": "cn"}),
]


@pytest.mark.parametrize("cls,base,more,change", FROZEN, ids=[c[0].__name__ for c in FROZEN])
def test_frozen_records_behave_as_generated(cls, base, more, change):
    twin = dataclass_twin(cls, True)
    for kw in (base, {**base, **more}):
        a, ta = cls(**kw), twin(**kw)
        assert repr(a) == repr(ta)
        assert a == cls(**kw) and hash(a) == hash(cls(**kw)) == hash(tuple(getattr(a, n) for n in a._fields))
        assert dataclasses.asdict(a) == dataclasses.asdict(ta)
        assert a.__eq__(ta) is NotImplemented
        c, tc = dataclasses.replace(a, **change), dataclasses.replace(ta, **change)
        assert repr(c) == repr(tc) and type(c) is cls and c != a
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(a, next(iter(base)), "x")
        with pytest.raises(dataclasses.FrozenInstanceError):
            a.other = 1  # type: ignore[attr-defined]
    assert [(f.name, f.default) for f in dataclasses.fields(cls)] == [(f.name, f.default) for f in dataclasses.fields(twin)]
    assert cls.__match_args__ == twin.__match_args__
    one = cls(**{**base, **more})
    if cls is not Rule:  # a rule's check is a local function: not picklable, as before
        assert pickle.loads(pickle.dumps(one)) == one
    assert copy.deepcopy(one) == one and copy.copy(one) == one
    # positional arguments in field order, as the generated __init__ takes them
    assert cls(*(getattr(one, f.name) for f in dataclasses.fields(cls))) == one


@pytest.mark.parametrize("cls,base,more,change", MUTABLE, ids=[c[0].__name__ for c in MUTABLE])
def test_mutable_records_behave_as_generated(cls, base, more, change):
    twin = dataclass_twin(cls, False)
    for kw in (base, {**base, **more}):
        a, ta = cls(**kw), twin(**kw)
        assert repr(a) == repr(ta) and a == cls(**kw) and a.__eq__(ta) is NotImplemented
        c = dataclasses.replace(a, **change)
        assert c != a and repr(c) == repr(dataclasses.replace(ta, **change))
        setattr(a, next(iter(change)), change[next(iter(change))])  # mutable, as generated
        assert a == c
    assert cls.__hash__ is None and twin.__hash__ is None
    with pytest.raises(TypeError):
        hash(cls(**base))
    assert [(f.name, f.default) for f in dataclasses.fields(cls)] == [(f.name, f.default) for f in dataclasses.fields(twin)]


def test_device_profile_checks_and_defaults_as_before():
    assert DeviceProfile() == DeviceProfile("cuda", 1, (9, 0), 80 * 1024**3, "", frozenset())
    assert DeviceProfile().unsupported_dtypes == frozenset()
    assert DeviceProfile.for_device("cuda:1").count == 2 and DeviceProfile.for_device("cuda:1").with_count(4).count == 4
    with pytest.raises(ValueError, match="count must be >= 1"):
        DeviceProfile(count=0)
    with pytest.raises(ValueError, match="is not a device type"):
        DeviceProfile(type="gpu")
    with pytest.raises(ValueError, match="count must be >= 1"):
        dataclasses.replace(DeviceProfile(), count=0)
