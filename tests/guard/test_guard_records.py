"""guard's records (``Note``, ``GuardReport``, ``Fix``) write their own methods instead of the dataclass decorator's
(compiled with ``exec`` at import: issue 43 point 4). Each behaves as the decorated class did: compared with a
twin the decorator makes from the same fields, with the same ``repr`` / ``compare`` flags."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from tests.support.twins import dataclass_twin
from torchdoctor._guard.api import Fix
from torchdoctor._guard.record import GuardReport, Note


CASES = [
    (Note, {}, {"maker": "made at app.py:3", "fix": "x.float()", "proof": "fix proven: re-run", "patch": "--- a",
                "groups": ("vae",), "aligns": ("float32", "bfloat16")}, {"fix": "y.half()"}),
    (Fix, dict(path="0.bias", found="float64", expected="float32"),
     {"kind": "device", "op": "aten.addmm.default", "module_path": "0", "maker": "m", "code": "c",
      "proof": "fix proven: ran", "patch": "p"}, {"found": "float16"}),
    (GuardReport, dict(mode="strict", problems=(), fixes=(), notes={}), {"problems": ("p",)}, {"mode": "fix"}),
]


@pytest.mark.parametrize("cls,base,more,change", CASES, ids=[c[0].__name__ for c in CASES])
def test_guard_records_behave_as_generated(cls, base, more, change):
    twin = dataclass_twin(cls, frozen=True)
    for kw in (base, {**base, **more}):
        a, ta = cls(**kw), twin(**kw)
        assert repr(a) == repr(ta)
        assert a == cls(**kw) and a.__eq__(ta) is NotImplemented
        if cls is not GuardReport:  # a report holds a dict of notes: unhashable, as the decorator's was
            assert hash(a) == hash(cls(**kw)) == hash(tuple(getattr(a, f.name) for f in dataclasses.fields(cls)
                                                             if f.compare))
        else:
            with pytest.raises(TypeError):
                hash(a)
        assert dataclasses.asdict(a) == dataclasses.asdict(ta)
        c, tc = dataclasses.replace(a, **change), dataclasses.replace(ta, **change)
        assert repr(c) == repr(tc) and type(c) is cls and c != a
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(a, next(iter(dataclasses.asdict(a))), "x")
        with pytest.raises(dataclasses.FrozenInstanceError):
            a.other = 1  # type: ignore[attr-defined]
        assert pickle.loads(pickle.dumps(a)) == a and copy.deepcopy(a) == a and copy.copy(a) == a
    assert [(f.name, f.default, f.repr, f.compare) for f in dataclasses.fields(cls)] == \
        [(f.name, f.default, f.repr, f.compare) for f in dataclasses.fields(twin)]
    assert cls.__match_args__ == twin.__match_args__


def test_fix_compares_by_what_it_changed_only():
    a = Fix("w", "float64", "float32", maker="one line", proof="fix proven: x")
    b = Fix("w", "float64", "float32", maker="another", proof=None)
    assert a == b and hash(a) == hash(b) and a.proven and not b.proven
    assert a.to_dict() == {"path": "w", "found": "float64", "expected": "float32", "kind": "dtype", "op": None,
                           "module_path": None, "maker": "one line", "code": None, "proof": "fix proven: x",
                           "patch": None, "proven": True}
