"""What a checkpoint holds (devices it was saved on, dtypes, shapes, quantization state), without loading it.

``.safetensors``: the JSON header only. ``torch.save`` files (zip or legacy): the pickle through the restricted
unpickler of :mod:`torchdoctor._unpickle`, which imports nothing it does not know and reads no storage data.
Sharded checkpoints come through their index JSON; directories (transformers, diffusers) are grouped per
subfolder, so paths read ``unet/conv_in.weight``.

>>> import os, tempfile, torch
>>> from safetensors.torch import save_file
>>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
>>> save_file({"w": torch.zeros(2, 3, dtype=torch.bfloat16)}, path)
>>> report = scan_checkpoint(path)
>>> report.ok, [t.compact for t in report.tensors]
(True, ['bf16[2,3]@cpu'])
"""

from __future__ import annotations

import gc
import json
import math
import os
import pickle
import struct
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import IO, Any, NamedTuple

import torch

from torchdoctor._report import (
    Problem,
    ScanReport,
    TensorInfo,
    device_str,
    dtype_str,
    human_bytes,
    parse_device,
    parse_dtype,
    same_device,
)
from torchdoctor._unpickle import SMALL_READ, CheckpointError, read_torch_file, walk

__all__ = ["CheckpointError", "cli_scan_path", "render_checkpoint", "role_of", "scan_checkpoint"]

EXTENSIONS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors format's own limit
_MAX_DIR_DEPTH = 4

_ST_DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "I32": "int32",
    "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16", "BF16": "bfloat16", "F32": "float32",
    "F64": "float64", "C64": "complex64", "C128": "complex128", "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu", "F4": "float4_e2m1fn_x2",
}  # fmt: skip

# Last key component -> quantization family; these keys are metadata, not weights (role ``quant_state``).
_QUANT_NAMES = {
    "absmax": "bnb4", "quant_map": "bnb4", "nested_absmax": "bnb4", "nested_quant_map": "bnb4",
    "SCB": "bnb8", "weight_format": "bnb8",
    "qzeros": "gptq", "scales": "gptq", "g_idx": "gptq",
    "weight_scale": "fp8", "weight_scale_inv": "fp8", "input_scale": "fp8", "output_scale": "fp8",
    "weight_zero_point": "fp8", "input_zero_point": "fp8",
}  # fmt: skip


def role_of(key: str) -> str:
    """A key's role, from its suffix: bitsandbytes / GPTQ / FP8 metadata is ``quant_state``.

    >>> role_of("model.layers.0.mlp.down_proj.weight"), role_of("fc.weight.absmax"), role_of("fc.SCB")
    ('parameter', 'quant_state', 'quant_state')
    >>> role_of("fc.weight.quant_state.bitsandbytes__nf4")
    'quant_state'
    """
    if ".quant_state." in f".{key}.":
        return "quant_state"
    return "quant_state" if key.rsplit(".", 1)[-1] in _QUANT_NAMES else "parameter"


class Entry(NamedTuple):
    """One tensor in one file, as the file describes it (a tuple: thousands are built per scan)."""

    key: str
    role: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int
    location: str
    storage: str  # identity of the bytes within the file: shared storages are counted once
    storage_nbytes: int
    view: tuple[Any, ...] = ()


@dataclass
class FileScan:
    """What one file holds; ``path`` is the file system path, ``label`` how messages name it."""

    path: str
    label: str
    format: str
    entries: list[Entry]
    metadata: dict[str, Any] = field(default_factory=dict)
    unsafe: list[tuple[str, str | None, tuple[Any, ...]]] = field(default_factory=list)  # (global, where, call args)
    notes: list[str] = field(default_factory=list)
    truncated: bool = False
    small: Callable[[str], bytes | None] = lambda key: None


@dataclass
class Group:
    """One checkpoint: a single file, or the shards of one index. ``prefix`` is prepended to its keys."""

    prefix: str
    files: list[FileScan]
    index: str | None = None
    index_missing: list[str] = field(default_factory=list)
    index_extra: list[str] = field(default_factory=list)

    def path_of(self, key: str) -> str:
        key = key or "<root>"
        return f"{self.prefix}/{key}" if self.prefix else key


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


# ---- problems: saved devices, dtypes, quantization state, unsafe globals ----------------------------------


@lru_cache(maxsize=256)
def _st_dtype(name: str) -> torch.dtype | None:
    dtype = getattr(torch, _ST_DTYPES.get(name, ""), None)
    return dtype if isinstance(dtype, torch.dtype) else None


@lru_cache(maxsize=256)
def _loc_str(location: str) -> str:
    try:
        return device_str(location)
    except (RuntimeError, ValueError, TypeError):
        return location


def _device_count(kind: str) -> int:
    """Devices of one type on this machine, asked without initialising them (device_count uses NVML first)."""
    if kind in ("cpu", "meta"):
        return 1
    try:
        if kind == "mps":
            return int(torch.backends.mps.is_available())
        module = getattr(torch, kind, None)
        return int(module.device_count()) if module is not None and hasattr(module, "device_count") else 0
    except Exception:  # a broken driver means "not here", never a crash
        return 0


def _map_location(dev: torch.device | None, want: torch.device | None) -> str:
    if want is not None:
        return json.dumps(device_str(want))
    if dev is not None and _device_count(dev.type) > 0:  # e.g. saved on cuda:1, this machine has only cuda:0
        return json.dumps({device_str(dev): f"{dev.type}:0"})
    return '"cpu"'


def _saved_device_problems(group: Group, fs: FileScan, want: torch.device | None) -> list[Problem]:
    by_loc: dict[str, list[Entry]] = {}
    for e in fs.entries:
        by_loc.setdefault(e.location, []).append(e)
    out = []
    for loc, entries in by_loc.items():
        try:
            dev: torch.device | None = torch.device(loc)
        except (RuntimeError, ValueError, TypeError):
            dev = None
        if dev is not None and dev.type != "meta":
            loads_as_saved = same_device(dev, want) if want else (dev.index or 0) < _device_count(dev.type)
            if dev.type == "cpu" or loads_as_saved:  # cpu storages load anywhere
                continue
        paths = tuple(group.path_of(e.key) for e in entries)
        size = human_bytes(sum({e.storage: e.storage_nbytes for e in entries}.values()))
        if dev is not None and dev.type == "meta":
            msg = (f"{len(paths)} tensor(s) in {fs.label} were saved on meta and hold no data; "
                   "re-save from a model with real weights")
            out.append(Problem("meta", paths[0], entries[0].role, "meta", "a real device", msg, tensors=paths))
            continue
        where = _loc_str(loc)
        if want is not None:
            why = f"you would load on {device_str(want)}, but torch.load restores them on {where}"
        else:
            n = _device_count(dev.type) if dev is not None else 0
            kind = dev.type.upper() if dev is not None else repr(loc)
            have = f"no {kind} device" if n == 0 else f"{n} {kind} device(s)"
            why = f"this machine has {have}, so torch.load fails (\"Attempting to deserialize object on ...\")"
        fix = f"torch.load({json.dumps(fs.path)}, map_location={_map_location(dev, want)})"
        msg = f"{len(paths)} tensor(s) ({size}) in {fs.label} were saved on {where}; {why}. Fix: {fix}"
        expected = device_str(want) if want is not None else "a device this machine has"
        out.append(Problem("saved_device", paths[0], entries[0].role, where, expected, msg, tensors=paths))
    return out


def _dtype_problems(
    group: Group, entries: list[Entry], want: torch.device | None, want_dtype: torch.dtype | None
) -> list[Problem]:
    out = []
    by_dtype: dict[torch.dtype, list[Entry]] = {}
    for e in entries:
        by_dtype.setdefault(e.dtype, []).append(e)
    for dt, es in by_dtype.items():
        if want is not None:
            from torchdoctor._profile import DeviceProfile

            if not DeviceProfile.for_device(want).supports(dt, "storage"):
                paths = tuple(group.path_of(e.key) for e in es)
                msg = (f"{len(paths)} tensor(s) are {dtype_str(dt)}, which {want.type} cannot hold; "
                       "convert before moving them there")
                expected = f"a dtype {want.type} supports"
                found = dtype_str(dt)
                out.append(Problem("unsupported_dtype", paths[0], es[0].role, found, expected, msg, tensors=paths))
        if want_dtype is None or dt == want_dtype or not dt.is_floating_point:
            continue
        floats = tuple(group.path_of(e.key) for e in es if e.role == "parameter")
        if floats:
            size = human_bytes(sum(e.nbytes for e in es if e.role == "parameter"))
            name = dtype_str(want_dtype)
            msg = (f"{len(floats)} floating tensor(s) ({size}) are {dtype_str(dt)}, expected {name}; "
                   f"cast when loading: from_pretrained(..., dtype=torch.{name}) or model.to(torch.{name})")
            out.append(Problem("dtype", floats[0], "parameter", dtype_str(dt), name, msg, tensors=floats))
    return out


# family -> check(group, entries by key, read small tensor bytes by key); a decorator refuses duplicates.
_QUANT_CHECKS: dict[str, Callable[[Group, dict[str, Entry], Callable[[str], bytes | None]], list[Problem]]] = {}


def _quant_check(family: str) -> Callable[[Any], Any]:
    def register(fn: Any) -> Any:
        if family in _QUANT_CHECKS:
            raise ValueError(f"quantization check {family!r} is already registered")
        _QUANT_CHECKS[family] = fn
        return fn

    return register


def _incomplete(group: Group, base: str, found: list[str], expected: list[str], what: str) -> Problem:
    missing = [k for k in expected if k not in found]
    msg = f"{what}: missing {', '.join(missing)}; loading fails or dequantizes garbage. Re-save the full state_dict"
    found_text = ", ".join(found) or "nothing"
    return Problem("quant_incomplete", group.path_of(base), "quant_state", found_text, ", ".join(expected), msg)


@_quant_check("bnb4")
def _bnb4(group: Group, by_key: dict[str, Entry], small: Callable[[str], bytes | None]) -> list[Problem]:
    states: dict[str, str] = {}
    companions: dict[str, set[str]] = {}
    for key in by_key:
        if ".quant_state.bitsandbytes__" in key:
            states[key.split(".quant_state.bitsandbytes__")[0]] = key
        elif key.rsplit(".", 1)[-1] in ("absmax", "quant_map", "nested_absmax", "nested_quant_map") and "." in key:
            base, name = key.rsplit(".", 1)
            companions.setdefault(base, set()).add(name)
    out = []
    for base, qkey in states.items():
        raw, nested = small(qkey), None
        try:
            nested = "nested_blocksize" in json.loads(raw.decode("utf-8")) if raw else None
        except (UnicodeDecodeError, ValueError, TypeError):
            pass
        have = companions.get(base, set())
        if nested is None:  # the JSON was not readable: trust the companions that are there
            nested = any(n.startswith("nested") for n in have)
        names = ["absmax", "quant_map"] + (["nested_absmax", "nested_quant_map"] if nested else [])
        expected = [base] + [f"{base}.{n}" for n in names]
        found = [k for k in expected if k in by_key]
        if found != expected:
            what = f"bitsandbytes 4-bit {qkey.rsplit('__', 1)[-1]} weight {base}"
            out.append(_incomplete(group, base, found, expected, what))
    for base, have in companions.items():
        if base not in states:
            found = [f"{base}.{n}" for n in sorted(have)]
            what = f"bitsandbytes 4-bit state of {base} without its packed quant_state"
            out.append(_incomplete(group, base, found, [f"{base}.quant_state.bitsandbytes__nf4|fp4"], what))
    return out


@_quant_check("bnb8")
def _bnb8(group: Group, by_key: dict[str, Entry], small: Callable[[str], bytes | None]) -> list[Problem]:
    def base_of(key: str, name: str) -> str | None:
        return "" if key == name else key[: -len(name) - 1] if key.endswith("." + name) else None

    if not any(k.endswith(("SCB", "weight_format")) for k in by_key):  # an int8 weight alone is not bitsandbytes
        return []
    scb = {b for k in by_key if (b := base_of(k, "SCB")) is not None}
    fmt = {b for k in by_key if (b := base_of(k, "weight_format")) is not None}
    int8 = {b for k, e in by_key.items() if (b := base_of(k, "weight")) is not None and e.dtype == torch.int8}
    out = []
    for base in sorted(scb | fmt | int8):
        w, s = f"{base}.weight" if base else "weight", f"{base}.SCB" if base else "SCB"
        found = [k for k in (w, s) if k in by_key]
        if len(found) < 2:
            out.append(_incomplete(group, base or w, found, [w, s], f"bitsandbytes 8-bit layer {base or '<root>'}"))
    return out


@_quant_check("gptq")
def _gptq(group: Group, by_key: dict[str, Entry], small: Callable[[str], bytes | None]) -> list[Problem]:
    parts: dict[str, set[str]] = {}
    for key in by_key:
        base, _, name = key.rpartition(".")
        if name in ("qweight", "qzeros", "scales"):
            parts.setdefault(base, set()).add(name)
    if not any("qweight" in p for p in parts.values()):
        return []
    out = []
    for base, have in parts.items():
        expected = [f"{base}.{n}" for n in ("qweight", "qzeros", "scales")]
        found = [f"{base}.{n}" for n in ("qweight", "qzeros", "scales") if n in have]
        if len(found) < 3:
            out.append(_incomplete(group, base, found, expected, f"GPTQ/AWQ layer {base}"))
    return out


_SCRIPT_MODULES = frozenset(
    "os posix nt subprocess sys shutil socket importlib runpy pty webbrowser pickle _pickle marshal ctypes code codeop "
    "types operator functools pdb timeit multiprocessing threading signal asyncio urllib http requests ftplib smtplib "
    "tempfile io _io _posixsubprocess builtins dill cloudpickle".split()
)
_DATA_MODULES = frozenset(
    "numpy pathlib argparse collections datetime enum decimal fractions uuid omegaconf typing copyreg".split()
)
_LIBRARY_MODULES = frozenset(
    "torch __torch__ pytorch_lightning lightning transformers diffusers accelerate peft tokenizers".split()
)


def _verdict(name: str) -> str:
    top = name.split(".", 1)[0]
    if top in _SCRIPT_MODULES or name.startswith(("torch.hub", "numpy.testing")):
        return "can run code or touch the system: torch.load(weights_only=False) would run it; do not load this file"
    if top in _LIBRARY_MODULES:
        return "a library class, harmless to import, that torch.load(weights_only=True) refuses (save a state_dict)"
    if top in _DATA_MODULES:
        return "a plain data type, usually harmless, that torch.load(weights_only=True) refuses"
    return f"code from module {name.rsplit('.', 1)[0]!r}: torch.load(weights_only=False) would import and run it"


def _short_repr(obj: Any) -> str:
    """Bounded by depth and length: pickle arguments can be deep or huge on purpose."""
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother, r.maxtuple, r.maxlist, r.maxdict = 3, 100, 60, 4, 4, 4
    try:
        text = r.repr(obj)
    except Exception:  # a hostile object must not break the report (STYLE 9)
        text = "<unprintable arguments>"
    return text if len(text) <= 160 else text[:157] + "..."


def _unsafe_problems(group: Group, fs: FileScan) -> list[Problem]:
    out = []
    for name, where, args in fs.unsafe:
        path = group.path_of(where) if where is not None else fs.label
        call = f" called with {_short_repr(args)}" if args else ""
        msg = f"pickle global {name}{call} in {fs.label} was not imported (placeholder); {_verdict(name)}"
        out.append(Problem("unsafe_global", path, "container", name, "an allow-listed global", msg))
    return out


def _truncated_problem(root: str) -> Problem:
    msg = "the pickle is too deep or too large to walk completely; some tensors are not listed"
    return Problem("truncated", root, "container", "walk limit", "complete walk", msg)


def _group_problems(group: Group, want: torch.device | None, want_dtype: torch.dtype | None) -> list[Problem]:
    entries = [e for fs in group.files for e in fs.entries]
    owner = {e.key: fs for fs in group.files for e in fs.entries}
    by_key = {e.key: e for e in entries}
    out: list[Problem] = []
    for fs in group.files:
        out += _saved_device_problems(group, fs, want) + _unsafe_problems(group, fs)
    out += _dtype_problems(group, entries, want, want_dtype)
    for check in _QUANT_CHECKS.values():
        out += check(group, by_key, lambda key: owner[key].small(key) if key in owner else None)
    return out


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
    with _gc_paused():
        groups, layout = collect(root)
        rows, summary = _rows(groups)
    problems = [p for group in groups for p in _group_problems(group, want, want_dtype)]
    truncated = any(fs.truncated for g in groups for fs in g.files)
    if truncated:
        problems.append(_truncated_problem(root))
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


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Unpickling builds many small objects; the cyclic GC would rescan the whole heap (torch's included)
    several times for a 4,000-tensor pickle, tripling the scan time. Nothing built here forms cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


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
                rows.append(TensorInfo(p, e.role, _as_device(e.location), e.dtype, e.shape, e.nbytes, False,
                                       alias if alias != p else None))
                if alias != p:
                    continue
                g = summary.get((e.location, e.dtype))
                if g is None:
                    g = summary[(e.location, e.dtype)] = {"device": _loc_str(e.location), "dtype": dtype_str(e.dtype),
                                                          "tensors": 0, "nbytes": 0}
                g["tensors"] += 1
                sid = (fs.label, e.storage)
                if sid not in seen_storage:
                    seen_storage.add(sid)
                    g["nbytes"] += e.storage_nbytes
    return rows, tuple(sorted(summary.values(), key=lambda g: -g["nbytes"]))


@lru_cache(maxsize=256)
def _as_device(location: str) -> torch.device:
    try:
        return torch.device(location)
    except (RuntimeError, ValueError, TypeError):
        return torch.device("meta")  # an unparseable location is reported by a saved_device problem


def _file_doc(fs: FileScan, group: Group) -> dict[str, Any]:
    doc: dict[str, Any] = {"file": fs.label, "format": fs.format, "tensors": len(fs.entries)}
    doc["nbytes"] = sum({e.storage: e.storage_nbytes for e in fs.entries}.values())
    doc["saved_on"] = sorted({_loc_str(e.location) for e in fs.entries})
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
            "saved_on": sorted({_loc_str(e.location) for e in entries}),
        }
        if g.index_missing or g.index_extra:
            doc["index_missing"] = g.index_missing[:100]
            doc["index_extra"] = g.index_extra[:100]
        out.append(doc)
    return out


def render_checkpoint(report: ScanReport, limit: int = 40) -> str:
    """Text form for the CLI: one line per checkpoint group, then problems and the device/dtype summary."""
    from torchdoctor._report import human_bytes, render_problems

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


def cli_scan_path(path: str, args: Any) -> int:
    """``torchdoctor scan FILE|DIR``: print the report (text or ``--json``); exit 0 clean, 1 problems, 2 unreadable."""
    from torchdoctor._cli import UsageError, parse_common, print_json

    device, dtype = parse_common(args)
    if getattr(args, "plan", False):
        raise UsageError(f"--plan lists moves of live objects; {path} is a checkpoint file, drop --plan")
    try:
        report = scan_checkpoint(path, device=device, dtype=dtype)
    except CheckpointError as exc:
        raise UsageError(str(exc)) from None
    if getattr(args, "json", False):
        print_json(report.to_dict())
    else:
        print(render_checkpoint(report, limit=getattr(args, "limit", 40) or 40))
    return 0 if report.ok else 1
