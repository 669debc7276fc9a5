"""``VirtualSession`` writes its own methods (``_report.records.MutableRecord``: a virtual run imports it before the
program's first line, and the dataclass decorator compiles each generated method at import). It behaves as the
generated class did: compared with a twin the decorator makes from its fields."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.support.twins import dataclass_twin
from torchdoctor._report.model import Problem
from torchdoctor._rules.profile import DeviceProfile
from torchdoctor._virtual.session import VirtualSession


_BASE = dict(device=torch.device("cuda", 1), dtype=torch.bfloat16, profile=DeviceProfile("cuda", 2))
_MORE = dict(data="meta", problems=[Problem("dtype", "1.bias", "parameter", "float64", "float32", "m")],
             stopped="why", culprits=1, sources={("k",): ("p",)}, stacks={("k", "p"): [("a.py", 3, "f")]}, ops=7,
             ran_on=("cuda:1",), networks=("n",), renamed={"a": "b"}, failure=ValueError("x"),
             whence={"device": "cuda:1"})


@pytest.mark.parametrize("kw", [_BASE, {**_BASE, **_MORE}], ids=["defaults", "all"])
def test_virtual_session_behaves_as_generated(kw: dict[str, object]) -> None:
    twin = dataclass_twin(VirtualSession)
    a, t = VirtualSession(**kw), twin(**kw)  # type: ignore[arg-type]
    assert repr(a) == repr(t) and a == VirtualSession(**kw) and a.__eq__(t) is NotImplemented  # type: ignore[arg-type]
    a._rec = object()  # neither compared nor shown
    assert a == VirtualSession(**kw) and "_rec" not in repr(a)  # type: ignore[arg-type]
    c, tc = dataclasses.replace(a, ops=9), dataclasses.replace(t, ops=9)
    assert repr(c) == repr(tc) and c != a and c._rec is None
    assert repr(dataclasses.asdict(c)) == repr(dataclasses.asdict(tc))  # (an exception copied is no equal)
    assert [(f.name, f.default, f.init, f.repr, f.compare) for f in dataclasses.fields(VirtualSession)] == \
        [(f.name, f.default, f.init, f.repr, f.compare) for f in dataclasses.fields(twin)]
    assert VirtualSession.__hash__ is None and VirtualSession.__match_args__ == twin.__match_args__
    with pytest.raises(TypeError):
        hash(a)


def test_the_containers_given_are_the_ones_kept() -> None:
    # virtual_devices hands the session its recorder's (still empty) problem list and stack table: filled later
    problems: list[Problem] = []
    stacks: dict[tuple[str, ...], list[tuple[str, int, str]]] = {}
    s = VirtualSession(**_BASE, problems=problems, stacks=stacks)  # type: ignore[arg-type]
    assert s.problems is problems and s.stacks is stacks
    assert VirtualSession(**_BASE).problems is not VirtualSession(**_BASE).problems  # type: ignore[arg-type]
