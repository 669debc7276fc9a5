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

import json
import math
import os
import pickle
import struct
import zipfile
from functools import lru_cache
from typing import IO, Any

import torch

from torchdoctor._checkpoint.checks import (
    Entry,
    FileScan,
    Group,
    as_device,
    group_problems,
    loc_str,
    role_of,
    truncated_problem,
)
from torchdoctor._report.model import ScanReport, TensorInfo
from torchdoctor._placement import device_str, dtype_str, parse_device, parse_dtype
from torchdoctor._checkpoint.torchfile import SMALL_READ, gc_paused, read_torch_file, walk
from torchdoctor._checkpoint.unpickle import CheckpointError

__all__ = ["CheckpointError", "render_checkpoint", "role_of", "scan_checkpoint"]

EXTENSIONS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors format's own limit
_MAX_DIR_DEPTH = 4

_ST_DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "I32": "int32",
    "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16", "BF16": "bfloat16", "F32": "float32",
    "F64": "float64", "C64": "complex64", "C128": "complex128", "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu", "F4": "float4_e2m1fn_x2",
}  # fmt: skip


@lru_cache(maxsize=256)
def _st_dtype(name: str) -> torch.dtype | None:
    dtype = getattr(torch, _ST_DTYPES.get(name, ""), None)
    return dtype if isinstance(dtype, torch.dtype) else None


def _read_safetensors(path: str, fh: IO[bytes], size: int, label: str) -> FileScan:
    if size < 8:
        raise CheckpointError(f"{label}: truncated safetensors file ({size} bytes, the header length alone needs 8)")
    (n,) = struct.unpack("<Q", fh.read(8))
    if n > _MAX_HEADER or 8 + n > size:
        raise CheckpointError(f"{label}: truncated or corrupted safetensors: header of {n} bytes, file has {size}")
    try:
        header = json.loads(fh.read(n))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{label}: corrupted safetensors header ({exc})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{label}: corrupted safetensors header (not a JSON object)")
    metadata = header.pop("__metadata__", None) or {}
    data_size = size - 8 - n
    entries: list[Entry] = []
    spans: dict[str, tuple[int, int]] = {}
    notes: list[str] = []
    for key, info in header.items():
        try:
            begin, end = map(int, info["data_offsets"])
            shape = tuple(map(int, info["shape"]))
            dtype_name = str(info["dtype"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{label}: corrupted safetensors header entry {key!r}") from None
        if not 0 <= begin <= end:
            raise CheckpointError(f"{label}: corrupted safetensors header: {key!r} has offsets {begin}..{end}")
        if end > data_size:
            raise CheckpointError(
                f"{label}: truncated: tensor {key!r} ends at data byte {end}, only {data_size} are present"
            )
        dtype = _st_dtype(dtype_name)
        if dtype is None:
            notes.append(f"{key}: dtype {dtype_name} has no torch dtype; shown as uint8")
            dtype = torch.uint8
        elif dtype_name != "F4" and math.prod(shape) * dtype.itemsize != end - begin:
            raise CheckpointError(
                f"{label}: corrupted safetensors header: {key!r} {dtype_name}{list(shape)} needs "
                f"{math.prod(shape) * dtype.itemsize} bytes, its offsets span {end - begin}"
            )
        spans[key] = (8 + n + begin, end - begin)
        entries.append(Entry(key, role_of(key), dtype, shape, end - begin, "cpu", key, end - begin))

    def small(key: str) -> bytes | None:
        start, length = spans[key]
        if length > SMALL_READ:
            return None
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(length)

    meta = {str(k): str(v) for k, v in metadata.items()} if isinstance(metadata, dict) else {}
    return FileScan(path, label, "safetensors", entries, meta, notes=notes, small=small)


def _read_pickled(path: str, fh: IO[bytes], size: int, label: str) -> FileScan:
    pf = read_torch_file(path, fh, size, label)
    result = walk(pf.root)
    entries: list[Entry] = []
    refs: dict[str, Any] = {}
    for key, stub in result.tensors:
        ref = stub.storage
        sid = f"{ref.location}/{ref.key}" if ref is not None else f"nostorage:{key}"
        view = (stub.offset, stub.shape, stub.stride, stub.dtype) if ref is not None else ()
        size = ref.nbytes if ref else 0
        entries.append(Entry(key, role_of(key), stub.dtype, stub.shape, stub.nbytes, stub.location, sid, size, view))
        if ref is not None:
            refs.setdefault(key, ref)
    unsafe = [(g, *result.placeholders.get(g, (None, ()))) for g in pf.unknown_globals]

    def small(key: str) -> bytes | None:
        return pf.read_small(refs[key]) if key in refs else None

    notes = list(pf.notes)
    return FileScan(path, label, pf.format, entries, {}, unsafe, notes, result.truncated, small)


def read_file(path: str, label: str) -> FileScan:
    """One checkpoint file, detected by content (not extension); unreadable input raises ``CheckpointError``."""
    try:
        size = os.path.getsize(path)
        if size == 0:
            raise CheckpointError(f"{label}: empty file (0 bytes)")
        with open(path, "rb") as fh:
            head = fh.read(9)
            fh.seek(0)
            if head[8:9] == b"{" or path.endswith(".safetensors"):
                return _read_safetensors(path, fh, size, label)
            if head.startswith(b"GGUF"):
                raise CheckpointError(f"{label}: GGUF file, not a PyTorch checkpoint (the gguf package reads it)")
            return _read_pickled(path, fh, size, label)
    except CheckpointError:
        raise
    except OSError as exc:
        raise CheckpointError(f"{label}: cannot read ({exc.strerror or exc})") from None
    except (ValueError, struct.error, zipfile.BadZipFile, pickle.UnpicklingError, RecursionError, MemoryError) as exc:
        raise CheckpointError(f"{label}: unreadable ({type(exc).__name__}: {str(exc)[:120]})") from None


def _read_index(index_path: str, prefix: str, label: str) -> Group:
    try:
        with open(index_path, encoding="utf-8") as f:
            doc = json.load(f)
        weight_map = doc["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError
    except OSError as exc:
        raise CheckpointError(f"{label}: cannot read ({exc.strerror or exc})") from None
    except (ValueError, KeyError, TypeError):
        raise CheckpointError(f"{label}: not a shard index (needs a JSON object with a 'weight_map')") from None
    folder = os.path.dirname(index_path)
    label_dir = os.path.dirname(label)
    files = []
    for shard in dict.fromkeys(str(v) for v in weight_map.values()):
        if os.path.isabs(shard) or ".." in shard.replace("\\", "/").split("/"):
            raise CheckpointError(f"{label}: shard {shard!r} points outside the checkpoint directory")
        shard_path = os.path.join(folder, shard)
        shard_label = f"{label_dir}/{shard}" if label_dir else shard
        if not os.path.isfile(shard_path):
            raise CheckpointError(f"{label}: shard {shard!r} listed in the index is missing")
        files.append(read_file(shard_path, shard_label))
    found = {e.key for fs in files for e in fs.entries}
    missing = [k for k in weight_map if k not in found]
    extra = sorted(found - set(weight_map))
    return Group(prefix, files, label, missing, extra)


def _shards_of(index_path: str) -> set[str]:
    try:
        with open(index_path, encoding="utf-8") as f:
            return {str(v) for v in json.load(f).get("weight_map", {}).values()}
    except (OSError, ValueError, AttributeError):
        return set()


def collect(root: str) -> tuple[list[Group], str | None]:
    """The checkpoints in a file or directory, with the key prefix each one gets, and the directory layout."""
    name = os.path.basename(os.path.normpath(root)) or root
    if os.path.isfile(root):
        if root.endswith(".index.json"):
            return [_read_index(root, "", name)], None
        return [Group("", [read_file(root, name)])], None
    if not os.path.isdir(root):
        raise CheckpointError(f"{root}: no such file or directory")
    groups: list[Group] = []
    base_depth = os.path.normpath(root).count(os.sep)
    for dirpath, dirnames, filenames in os.walk(root):
        depth = os.path.normpath(dirpath).count(os.sep) - base_depth
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and depth < _MAX_DIR_DEPTH)
        rel = os.path.relpath(dirpath, root).replace(os.sep, "/")
        rel = "" if rel == "." else rel
        indexes = sorted(f for f in filenames if f.endswith(".index.json"))
        sharded = set().union(*(_shards_of(os.path.join(dirpath, i)) for i in indexes)) if indexes else set()
        singles = sorted(f for f in filenames if f.endswith(EXTENSIONS) and f not in sharded and not f.startswith("."))
        units = indexes + singles
        for unit in units:
            prefix = rel if len(units) == 1 else f"{rel}/{unit}" if rel else unit
            label = f"{rel}/{unit}" if rel else unit
            full = os.path.join(dirpath, unit)
            group = _read_index(full, prefix, label) if unit in indexes else Group(prefix, [read_file(full, label)])
            groups.append(group)
    if not groups:
        raise CheckpointError(f"{root}: no checkpoint files ({', '.join(EXTENSIONS)}) or shard index in this directory")
    layout = (
        "diffusers" if os.path.isfile(os.path.join(root, "model_index.json"))
        else "transformers" if os.path.isfile(os.path.join(root, "config.json")) else None
    )  # fmt: skip
    return groups, layout


def scan_checkpoint(
    path: str | os.PathLike[str],
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
) -> ScanReport:
    """Inspect a checkpoint file or directory without running its pickle code or reading tensor data.

    ``device=`` asks "would it load there?" (saved locations needing ``map_location`` are problems even if
    this machine has them); without it, locations this machine lacks are. ``dtype=`` adds dtype problems
    for floating weights. Unreadable input raises :class:`CheckpointError` (a ``ValueError``).
    """
    want = parse_device(device) if device is not None else None
    want_dtype = parse_dtype(dtype) if dtype is not None else None
    root = os.fspath(path)
    with gc_paused():
        groups, layout = collect(root)
        rows, summary = _rows(groups)
    problems = [p for group in groups for p in group_problems(group, want, want_dtype)]
    truncated = any(fs.truncated for g in groups for fs in g.files)
    if truncated:
        problems.append(truncated_problem(root))
    expected = {"device": device_str(want) if want else "", "dtype": dtype_str(want_dtype) if want_dtype else ""}
    extra: dict[str, Any] = {
        "files": [_file_doc(fs, g) for g in groups for fs in g.files],
        "layout": layout,
        "groups": _group_docs(groups),
    }
    if len(groups) == 1 and len(groups[0].files) == 1 and groups[0].files[0].metadata:
        extra["metadata"] = groups[0].files[0].metadata
    return ScanReport(
        tensors=tuple(rows),
        problems=tuple(problems),
        expected={"": {k: v for k, v in expected.items() if v}} if any(expected.values()) else {},
        source=root,
        truncated=truncated,
        summary=summary,
        extra=extra,
    )


def _rows(groups: list[Group]) -> tuple[list[TensorInfo], tuple[dict[str, Any], ...]]:
    """One TensorInfo per key (a second key on the same view is an alias), and the summary by saved device
    and dtype, counting each storage once."""
    rows: list[TensorInfo] = []
    summary: dict[tuple[str, torch.dtype], dict[str, Any]] = {}
    seen_storage: set[tuple[str, str]] = set()
    for group in groups:
        first: dict[tuple[str, str, tuple[Any, ...]], str] = {}
        prefix = f"{group.prefix}/" if group.prefix else ""
        for fs in group.files:
            for e in fs.entries:
                p = prefix + (e.key or "<root>")
                alias = first.setdefault((fs.label, e.storage, e.view), p) if e.view else p
                rows.append(TensorInfo(p, e.role, as_device(e.location), e.dtype, e.shape, e.nbytes, False,
                                       alias if alias != p else None))
                if alias != p:
                    continue
                g = summary.get((e.location, e.dtype))
                if g is None:
                    g = summary[(e.location, e.dtype)] = {"device": loc_str(e.location), "dtype": dtype_str(e.dtype),
                                                         "tensors": 0, "nbytes": 0}
                g["tensors"] += 1
                sid = (fs.label, e.storage)
                if sid not in seen_storage:
                    seen_storage.add(sid)
                    g["nbytes"] += e.storage_nbytes
    return rows, tuple(sorted(summary.values(), key=lambda g: -g["nbytes"]))


def _file_doc(fs: FileScan, group: Group) -> dict[str, Any]:
    doc: dict[str, Any] = {"file": fs.label, "format": fs.format, "tensors": len(fs.entries)}
    doc["nbytes"] = sum({e.storage: e.storage_nbytes for e in fs.entries}.values())
    doc["saved_on"] = sorted({loc_str(e.location) for e in fs.entries})
    if fs.metadata:
        doc["metadata"] = fs.metadata
    if fs.notes:
        doc["notes"] = fs.notes
    if group.index:
        doc["index"] = group.index
    return doc


def _group_docs(groups: list[Group]) -> list[dict[str, Any]]:
    out = []
    for g in groups:
        entries = [e for fs in g.files for e in fs.entries]
        dtypes: dict[str, int] = {}
        for e in entries:
            name = str(e.dtype).removeprefix("torch.")
            dtypes[name] = dtypes.get(name, 0) + 1
        doc: dict[str, Any] = {
            "group": g.prefix or ".",
            "files": [fs.label for fs in g.files],
            "tensors": len(entries),
            "nbytes": sum({(fs.label, e.storage): e.storage_nbytes for fs in g.files for e in fs.entries}.values()),
            "dtypes": dtypes,
            "saved_on": sorted({loc_str(e.location) for e in entries}),
        }
        if g.index_missing or g.index_extra:
            doc["index_missing"] = g.index_missing[:100]
            doc["index_extra"] = g.index_extra[:100]
        out.append(doc)
    return out


def render_checkpoint(report: ScanReport, limit: int = 40) -> str:
    """Text form for the CLI: one line per checkpoint group, then problems and the device/dtype summary."""
    from torchdoctor._report.text import human_bytes, render_problems

    groups = report.extra.get("groups", [])
    layout = report.extra.get("layout")
    total = sum(g["nbytes"] for g in groups)
    head = f"{report.source}" + (f" ({layout} layout)" if layout else "")
    n_files = len(report.extra.get("files", []))
    lines = [f"{head}: {len(report.tensors)} tensors, {human_bytes(total)} in {n_files} file(s)"]
    for g in groups[:limit]:
        dts = ", ".join(f"{k} x{v}" for k, v in sorted(g["dtypes"].items(), key=lambda kv: -kv[1]))
        where = ", ".join(g["saved_on"]) or "-"
        size = human_bytes(g["nbytes"])
        lines.append(f"  {g['group']:<24} {g['tensors']:>6} tensors {size:>11}  saved on {where}  {dts}")
        if g.get("index_missing"):
            missing = g["index_missing"]
            lines.append(f"    index lists {len(missing)} key(s) no shard holds, e.g. {missing[0]}")
    if len(groups) > limit:
        lines.append(f"  ... and {len(groups) - limit} more groups")
    want = report.expected.get("", {})
    if want:
        lines.append("checked against: " + ", ".join(f"{k} {v}" for k, v in want.items()))
    if report.problems:
        lines.append(f"{len(report.problems)} problem(s):")
        lines.extend(render_problems(report.problems, limit))
    else:
        lines.append("ok: no problems found")
    lines.append("by saved device and dtype, each storage once:")
    for s in report.summary[:limit]:
        lines.append(f"  {s['device']:<8} {s['dtype']:<14} {s['tensors']:>7} tensors  {human_bytes(s['nbytes']):>11}")
    return "\n".join(lines)

