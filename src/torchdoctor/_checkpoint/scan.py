"""What a checkpoint holds (devices it was saved on, dtypes, shapes, quantization state), without loading it.

``.safetensors``: the JSON header only. ``torch.save`` files (zip or legacy): read by :mod:`torchdoctor._checkpoint.torchfile`
through the restricted unpickler of :mod:`torchdoctor._checkpoint.unpickle`, which imports nothing it does not know and
reads no storage data. Sharded checkpoints come through their index JSON; directories (transformers, diffusers)
are grouped per subfolder, so paths read ``unet/conv_in.weight``. The problems are found by
:mod:`torchdoctor._checkpoint.checks`; this module reads, summarises and renders.

>>> import os, tempfile, torch
>>> from safetensors.torch import save_file
>>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
>>> save_file({"w": torch.zeros(2, 3, dtype=torch.bfloat16)}, path)
>>> report = scan_checkpoint(path)
>>> report.ok, [t.compact for t in report.tensors]
(True, ['bf16[2,3]@cpu'])
"""

from __future__ import annotations

import os
from typing import Any

from torchdoctor._checkpoint.checks import Entry, FileScan, Group, group_problems, loc_str, role_of, truncated_problem
from torchdoctor._checkpoint.collect import Skipped, collect, gc_paused
from torchdoctor._checkpoint.dtypes import DType, from_torch, majority_dtype, to_torch
from torchdoctor._checkpoint.result import CheckpointReport, Finding, Row
from torchdoctor._checkpoint.errors import CheckpointError

# Not imported here: the text renderer (``render``: the command line's, not the API's) and ``expect`` (read only
# when there is a dtype= or a config.json to read): a bare file's first scan never loads them (docs/checkpoints.md,
# "Cost").

__all__ = ["CheckpointError", "check_checkpoint", "role_of", "scan_checkpoint", "to_scan_report"]


def scan_checkpoint(path: str | os.PathLike[str], *, device: Any = None, dtype: Any = None) -> Any:
    """Inspect a checkpoint file or directory without running its pickle code or reading tensor data.

    ``device=`` asks "would it load there?" (saved locations needing ``map_location`` are problems even if
    this machine has them); without it, locations this machine lacks are. ``dtype=`` adds dtype problems
    for floating weights. Unreadable input raises :class:`CheckpointError` (a ``ValueError``). Returns a
    :class:`torchdoctor.ScanReport` (torch types: the command line uses :func:`check_checkpoint` instead).
    """
    from torchdoctor._placement import device_str, parse_device, parse_dtype

    want = device_str(parse_device(device)) if device is not None else None
    want_dtype = from_torch(parse_dtype(dtype)) if dtype is not None else None
    return to_scan_report(check_checkpoint(path, device=want, dtype=want_dtype))


def to_scan_report(report: CheckpointReport) -> Any:
    """The Python API's :class:`torchdoctor.ScanReport` of a torch-free report: ``torch.device`` / ``torch.dtype``."""
    import torch

    from torchdoctor._report.model import Problem, ScanReport, TensorInfo

    devices: dict[str, Any] = {}
    dtypes: dict[DType, Any] = {}

    def device(location: str) -> Any:
        if location not in devices:
            try:
                devices[location] = torch.device(location)
            except (RuntimeError, ValueError, TypeError):
                devices[location] = torch.device("meta")  # an unparseable location is reported by a saved_device problem
        return devices[location]

    rows = []
    for r in report.tensors:
        dt = dtypes.get(r.dtype)
        if dt is None:
            dt = dtypes[r.dtype] = to_torch(r.dtype)
        rows.append(TensorInfo(r.path, r.role, device(r.location), dt, r.shape, r.nbytes, False, r.alias_of))
    problems = tuple(Problem(p.kind, p.path, p.role, p.found, p.expected, p.message, p.op, p.module_path,
                             p.module_type, p.tensors) for p in report.problems)
    return ScanReport(tensors=tuple(rows), problems=problems, expected=report.expected, source=report.source,
                      truncated=report.truncated, summary=report.summary, extra=report.extra)


def check_checkpoint(path: str | os.PathLike[str], *, device: str | None = None,
                     dtype: DType | None = None) -> CheckpointReport:
    """:func:`scan_checkpoint` without torch: ``device`` is a device string as ``device_str`` writes it
    (``cuda:1``, ``cpu``), ``dtype`` a :class:`DType`. What the command line and the pre-commit hook call."""
    root = os.fspath(path)
    with gc_paused():
        groups, layout, skipped = collect(root)
        rows, summary = _rows(groups)
    problems: list[Finding] = []
    expected: dict[str, dict[str, str]] = {}
    if device is not None or dtype is not None:
        expected[""] = {k: v for k, v in (("device", device or ""), ("dtype", dtype.name if dtype else "")) if v}
    for group in groups:
        folder = _folder(group)
        exp = None
        if dtype is not None or (folder and os.path.isfile(os.path.join(folder, "config.json"))):
            from torchdoctor._checkpoint.expect import expectation

            exp = expectation(folder, dtype)
        if exp is not None and exp.rule != "explicit":
            expected[group.prefix or "."] = {"dtype": exp.dtype.name, "rule": exp.rule, "why": exp.why}
        problems += group_problems(group, device, exp)
    problems += [_unreadable(s) for s in skipped if s.loaded]
    truncated = any(fs.truncated for g in groups for fs in g.files)
    if truncated:
        problems.append(truncated_problem(root))
    extra: dict[str, Any] = {
        "files": [_file_doc(fs, g) for g in groups for fs in g.files],
        "layout": layout,
        "groups": _group_docs(groups),
        "skipped": [{"path": s.label, "reason": s.reason} for s in skipped],
    }
    if len(groups) == 1 and len(groups[0].files) == 1 and groups[0].files[0].metadata:
        extra["metadata"] = groups[0].files[0].metadata
    return CheckpointReport(tensors=tuple(rows), problems=tuple(problems), expected=expected, source=root,
                            truncated=truncated, summary=summary, extra=extra)


def _folder(group: Group) -> str | None:
    """Where the ``config.json`` of a checkpoint would sit: beside its (first) file, or in its directory."""
    if not group.files:
        return None
    path = group.files[0].path
    return path if group.files[0].format == "torch-dcp" else os.path.dirname(path)


def _unreadable(entry: Skipped) -> Finding:
    msg = f"{entry.label}: {entry.reason}; the rest of the directory was checked without it"
    return Finding("unreadable", entry.label, "container", entry.reason, "a readable checkpoint", msg)


def _rows(groups: list[Group]) -> tuple[list[Row], tuple[dict[str, Any], ...]]:
    """One TensorInfo per key (a second key on the same view is an alias), and the summary by saved device
    and dtype, counting each storage once."""
    rows: list[Row] = []
    new_row = tuple.__new__  # Row(...) through its generated __new__ costs a Python call per tensor
    summary: dict[tuple[str, DType], dict[str, Any]] = {}
    seen_storage: set[tuple[str, str]] = set()
    for group in groups:
        first: dict[tuple[str, str, tuple[Any, ...]], str] = {}
        prefix = f"{group.prefix}/" if group.prefix else ""
        for fs in group.files:
            for e in fs.entries:
                p = prefix + (e.key or "<root>")
                alias = first.setdefault((fs.label, e.storage, e.view), p) if e.view else p
                rows.append(new_row(Row, (p, e.role, e.location, e.dtype, e.shape, e.nbytes,
                                          alias if alias != p else None)))
                if alias != p:
                    continue
                g = summary.get((e.location, e.dtype))
                if g is None:
                    g = summary[(e.location, e.dtype)] = {"device": loc_str(e.location), "dtype": e.dtype.name,
                                                         "tensors": 0, "nbytes": 0}
                g["tensors"] += 1
                sid = (fs.label, e.storage)
                if sid not in seen_storage:
                    seen_storage.add(sid)
                    g["nbytes"] += e.storage_nbytes
    return rows, tuple(sorted(summary.values(), key=lambda g: -g["nbytes"]))


def _file_nbytes(fs: FileScan) -> int:
    """Bytes of the file's storages, each once."""
    return sum({e.storage: e.storage_nbytes for e in fs.entries}.values())


def _saved_on(entries: list[Entry]) -> list[str]:
    return sorted({loc_str(location) for location in {e.location for e in entries}})


def _file_doc(fs: FileScan, group: Group) -> dict[str, Any]:
    doc: dict[str, Any] = {"file": fs.label, "format": fs.format, "tensors": len(fs.entries)}
    doc["nbytes"] = _file_nbytes(fs)
    doc["saved_on"] = _saved_on(fs.entries)
    if fs.metadata:
        doc["metadata"] = fs.metadata
    if fs.notes:
        doc["notes"] = fs.notes
    if group.index:
        doc["index"] = group.index
    if fs.sharding:
        doc["sharding"] = fs.sharding
    return doc


def _group_docs(groups: list[Group]) -> list[dict[str, Any]]:
    out = []
    for g in groups:
        entries = [e for fs in g.files for e in fs.entries]
        all_dtypes = [e.dtype for e in entries]
        counts: dict[str, int] = {}
        for dt in all_dtypes:
            counts[dt.name] = counts.get(dt.name, 0) + 1
        doc: dict[str, Any] = {
            "group": g.prefix or ".",
            "files": [fs.label for fs in g.files],
            "tensors": len(entries),
            "nbytes": sum(_file_nbytes(fs) for fs in g.files),  # a storage is one file's: counted per file
            "dtypes": counts,
            "saved_on": _saved_on(entries),
        }
        major = majority_dtype(all_dtypes)
        if major is not None:
            doc["majority_dtype"] = {"dtype": major[0].name, "tensors": major[1], "of": major[2]}
        if g.index_missing or g.index_extra:
            doc["index_missing"] = g.index_missing[:100]
            doc["index_extra"] = g.index_extra[:100]
        out.append(doc)
    return out
