"""scan keeps its rows as tuples and makes the ``TensorInfo`` objects when ``report.tensors`` is first read (issue 28):
the report must behave exactly as one made eagerly through ``ScanReport(...)`` with the same values."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import torch

import torchdoctor
from torchdoctor import ScanReport, TensorInfo


def _model() -> torch.nn.Module:
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    m[0].bias.data = m[0].bias.data.double()
    m.register_buffer("steps", torch.zeros(3, dtype=torch.long))
    m.shared = m[0].weight  # a parameter of the root too: its first path, and 0.weight an alias
    return m


def _eager(r: ScanReport) -> ScanReport:
    """The same report made through __init__, every field given."""
    return ScanReport(tensors=tuple(dataclasses.replace(t) for t in r.tensors), problems=r.problems,
                      expected=r.expected, source=r.source, truncated=r.truncated, summary=r.summary,
                      extra=r.extra, verb=r.verb)


def test_rows_become_tensor_infos_once_and_as_before():
    m = _model()
    lazy = torchdoctor.scan(m)
    assert "tensors" not in vars(lazy)  # nothing made before it is read
    first = lazy.tensors
    assert first is lazy.tensors  # made once, then kept
    assert all(type(t) is TensorInfo and type(t.shape) is tuple for t in first)
    assert [t.path for t in first] == ["shared", "0.weight", "0.bias", "1.weight", "1.bias", "steps"]
    assert first[1].alias_of == "shared" and first[2].dtype == torch.float64 and first[0].shape == (4, 4)
    assert first[0].nbytes == 64 and first[5].role == "buffer" and first[0].moved_by_module_to is True
    assert list(vars(lazy)) == [f.name for f in dataclasses.fields(ScanReport)]  # field order, as __init__ stores


def test_unread_report_compares_prints_copies_and_pickles_as_an_eager_one():
    m = _model()
    eager = _eager(torchdoctor.scan(m))
    for op in (lambda r: r == eager, lambda r: eager == r, repr, str, lambda r: r.to_dict(), dataclasses.asdict,
               lambda r: pickle.dumps(r), lambda r: pickle.loads(pickle.dumps(r)) == eager,
               lambda r: copy.deepcopy(r) == eager, lambda r: copy.copy(r) == eager,
               lambda r: dataclasses.replace(r, source="x") == dataclasses.replace(eager, source="x"),
               lambda r: len(r.tensors), lambda r: list(vars(pickle.loads(pickle.dumps(r))))):
        assert op(torchdoctor.scan(m)) == op(eager)  # each on a fresh, unread report
    assert torchdoctor.scan(m) == eager and (torchdoctor.scan(m) != eager) is False


def test_rows_are_read_at_scan_time_not_when_the_report_is_read():
    m = _model()
    report = torchdoctor.scan(m)
    m.to(torch.float16)
    assert {t.dtype for t in report.tensors if t.path != "steps"} == {torch.float32, torch.float64}


def test_missing_attributes_still_raise_as_before():
    report = torchdoctor.scan(_model())
    for name in ("nope", "_rows_x"):
        try:
            getattr(report, name)
        except AttributeError as exc:
            assert str(exc) == f"'ScanReport' object has no attribute '{name}'"
        else:
            raise AssertionError(name)
    assert not hasattr(report, "nope") and hasattr(report, "tensors")
