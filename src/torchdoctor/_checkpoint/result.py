"""A checkpoint scan's result without torch: findings, one row per tensor, the JSON document.

The command line (``torchdoctor scan FILE``, the pre-commit hook) prints these as they are; the Python API turns
them into :class:`torchdoctor.ScanReport` (``torch.device`` / ``torch.dtype`` rows, ``Problem`` findings) at its
boundary (:func:`torchdoctor._checkpoint.scan.scan_checkpoint`). Both give the same JSON document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from torchdoctor._checkpoint.dtypes import DType, location_str, parse_location
from torchdoctor._report.order import split_relocations
from torchdoctor._report.text import schema

__all__ = ["CheckpointReport", "Finding", "Row", "row_device"]


@dataclass(frozen=True)
class Finding:
    """A problem found in a checkpoint: the fields (and JSON) of :class:`torchdoctor.Problem`."""

    kind: str
    path: str
    role: str
    found: str
    expected: str
    message: str
    op: str | None = None
    module_path: str | None = None
    module_type: str | None = None
    tensors: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "role": self.role, "found": self.found,
                "expected": self.expected, "message": self.message, "op": self.op, "module_path": self.module_path,
                "module_type": self.module_type, "tensors": list(self.tensors)}

    def __str__(self) -> str:
        return f"{self.kind:<8} {self.path}: {self.message}"


def row_device(location: str) -> str:
    """The device a row shows: the saved location, ``meta`` for one torch cannot parse (reported separately)."""
    return location_str(location) if parse_location(location) is not None else "meta"


class Row(NamedTuple):
    """One tensor path of the file (a ``TensorInfo`` without torch); a tuple: a scan builds one per tensor."""

    path: str
    role: str
    location: str
    dtype: DType
    shape: tuple[int, ...]
    nbytes: int
    alias_of: str | None = None

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


@dataclass(frozen=True)
class CheckpointReport:
    """What :func:`torchdoctor._checkpoint.scan.check_checkpoint` found (the fields of a ``ScanReport``)."""

    tensors: tuple[Row, ...]
    problems: tuple[Finding, ...]
    expected: dict[str, dict[str, str]] = field(default_factory=dict)
    source: str | None = None
    truncated: bool = False
    summary: tuple[dict[str, Any], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "schema": schema("scan"), "ok": self.ok, "source": self.source, "truncated": self.truncated,
            "expected": self.expected, "problems": [p.to_dict() for p in self.problems],
            "relocations": [m.to_dict() for m in split_relocations(self.problems, self.expected, self.tensors)[1]],
            "summary": list(self.summary), "tensors": [t.to_dict() for t in self.tensors],
        }
        doc.update(self.extra)
        return doc
