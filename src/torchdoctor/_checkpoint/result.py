"""A checkpoint scan's result without torch: findings, one row per tensor, the JSON document.

The command line (``torchdoctor scan FILE``, the pre-commit hook) prints these as they are; the Python API turns
them into :class:`torchdoctor.ScanReport` (``torch.device`` / ``torch.dtype`` rows, ``Problem`` findings) at its
boundary (:func:`torchdoctor._checkpoint.scan.scan_checkpoint`). Both give the same JSON document.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from torchdoctor._checkpoint.dtypes import DType, location_str, parse_location
from torchdoctor._report.text import schema

__all__ = ["CheckpointReport", "Finding", "Row", "row_device"]


_FINDING_FIELDS = ("kind", "path", "role", "found", "expected", "message", "op", "module_path", "module_type", "tensors")


class Finding:
    """A problem found in a checkpoint: the fields (and JSON) of :class:`torchdoctor.Problem`. Immutable. (Plain
    classes here, not dataclasses: ``torchdoctor scan FILE`` never imports ``dataclasses``, which imports
    ``inspect`` and compiles methods at import; docs/checkpoints.md, "Cost".)"""

    __slots__ = _FINDING_FIELDS
    kind: str
    path: str
    role: str
    found: str
    expected: str
    message: str
    op: str | None
    module_path: str | None
    module_type: str | None
    tensors: tuple[str, ...]

    def __init__(self, kind: str, path: str, role: str, found: str, expected: str, message: str, op: str | None = None,
                 module_path: str | None = None, module_type: str | None = None, tensors: tuple[str, ...] = ()) -> None:
        for name, value in zip(_FINDING_FIELDS, (kind, path, role, found, expected, message, op, module_path,
                                                 module_type, tensors)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Finding is immutable (set {name!r})")

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, n) for n in _FINDING_FIELDS)

    def __eq__(self, other: object) -> bool:
        return type(other) is Finding and self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return "Finding(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in _FINDING_FIELDS) + ")"

    def replace(self, **changes: Any) -> Finding:
        """A copy with some fields changed (``dataclasses.replace``)."""
        return Finding(**{n: changes.get(n, getattr(self, n)) for n in _FINDING_FIELDS})

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "role": self.role, "found": self.found,
                "expected": self.expected, "message": self.message, "op": self.op, "module_path": self.module_path,
                "module_type": self.module_type, "tensors": list(self.tensors)}

    def __str__(self) -> str:
        return f"{self.kind:<8} {self.path}: {self.message}"


def row_device(location: str) -> str:
    """The device a row shows: the saved location, ``meta`` for one torch cannot parse (reported separately)."""
    return location_str(location) if parse_location(location) is not None else "meta"


class Row(NamedTuple("Row", [("path", str), ("role", str), ("location", str), ("dtype", DType),
                              ("shape", tuple[int, ...]), ("nbytes", int), ("alias_of", str | None)])):
    """One tensor path of the file (a ``TensorInfo`` without torch); a tuple: a scan builds one per tensor.
    (NamedTuple's call form: see ``checks.Entry``.)"""

    __slots__ = ()

    @property
    def moved_by_module_to(self) -> bool:  # a file's tensors were moved by nobody
        return False

    @property
    def device(self) -> str:
        return row_device(self.location)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "role": self.role, "device": row_device(self.location), "dtype": self.dtype.name,
                "shape": list(self.shape), "nbytes": self.nbytes, "moved_by_module_to": False,
                "alias_of": self.alias_of}


_REPORT_FIELDS = ("tensors", "problems", "expected", "source", "truncated", "summary", "extra")


class CheckpointReport:
    """What :func:`torchdoctor._checkpoint.scan.check_checkpoint` found (the fields of a ``ScanReport``). Immutable."""

    __slots__ = _REPORT_FIELDS
    tensors: tuple[Row, ...]
    problems: tuple[Finding, ...]
    expected: dict[str, dict[str, str]]
    source: str | None
    truncated: bool
    summary: tuple[dict[str, Any], ...]
    extra: dict[str, Any]

    def __init__(self, tensors: tuple[Row, ...], problems: tuple[Finding, ...],
                 expected: dict[str, dict[str, str]] | None = None, source: str | None = None, truncated: bool = False,
                 summary: tuple[dict[str, Any], ...] = (), extra: dict[str, Any] | None = None) -> None:
        for name, value in zip(_REPORT_FIELDS, (tensors, problems, {} if expected is None else expected, source,
                                                truncated, summary, {} if extra is None else extra)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"CheckpointReport is immutable (set {name!r})")

    def __eq__(self, other: object) -> bool:
        return type(other) is CheckpointReport and all(getattr(self, n) == getattr(other, n) for n in _REPORT_FIELDS)

    __hash__ = None  # type: ignore[assignment]  # it holds dicts

    def __repr__(self) -> str:
        return (f"CheckpointReport(source={self.source!r}, tensors={len(self.tensors)}, "
                f"problems={len(self.problems)}, truncated={self.truncated!r})")

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        relocations: list[Any] = []
        # relocations are problems set apart, only for a component whose device was asked with a rule
        # (``device_rule``): none without problems or without such a row (nor ``order``'s import, nor dataclasses)
        if self.problems and any(isinstance(e, dict) and e.get("device_rule") for e in self.expected.values()):
            from torchdoctor._report.order import split_relocations

            relocations = split_relocations(self.problems, self.expected, self.tensors)[1]
        doc: dict[str, Any] = {
            "schema": schema("scan"), "ok": self.ok, "source": self.source, "truncated": self.truncated,
            # the same key the API's report writes: no tensor and nothing wrong (the CLI's exit 2)
            "nothing_to_check": not self.problems and not self.tensors,
            "expected": self.expected, "problems": [p.to_dict() for p in self.problems],
            "relocations": [m.to_dict() for m in relocations],
            "summary": list(self.summary), "tensors": [t.to_dict() for t in self.tensors],
        }
        doc.update(self.extra)
        return doc
