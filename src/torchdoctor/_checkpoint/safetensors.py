"""``.safetensors`` files: the JSON header only, validated as strictly as ``safetensors.safe_open`` does.

A file the real library refuses is never reported as fine: the header must be at most 100,000,000 bytes of
UTF-8 JSON (no ``NaN``, no number out of range, nesting at most 128 deep), ``__metadata__`` a map of strings,
every other key a tensor with a known dtype, a shape of non-negative integers and two integer offsets; sorted
by offset, the tensors must tile the data region from byte 0 to the end of the file with no gap or overlap,
each exactly as long as its shape and dtype say.

>>> import json, struct, tempfile, os
>>> head = json.dumps({"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}).encode()
>>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
>>> _ = open(path, "wb").write(struct.pack("<Q", len(head)) + head + bytes(4))
>>> with open(path, "rb") as f:
...     [(e.key, e.dtype, e.shape) for e in read_safetensors(path, f, os.path.getsize(path), "m").entries]
[('w', torch.float16, (2,))]
"""

from __future__ import annotations

import json
import math
import re
import struct
from typing import IO, Any

from torchdoctor._checkpoint.dtypes import DTYPES, UINT8, DType, clipped, shown
from torchdoctor._checkpoint.checks import Entry, FileScan, role_of
from torchdoctor._checkpoint.errors import SMALL_READ, CheckpointError

__all__ = ["MAX_HEADER", "MAX_TENSORS", "read_safetensors"]

MAX_HEADER = 100_000_000  # the safetensors library's own limit (decimal, not 100 MiB)
MAX_TENSORS = 200_000  # per file, as a pickle's opcode budget allows ~160,000: a large model shard holds ~2,000
_MAX_JSON_DEPTH = 127  # serde_json's recursion limit, as safe_open enforces it
_U64 = 1 << 64

# safetensors dtype -> (bits per element, torch dtype name or None when torch has none)
_DTYPES: dict[str, tuple[int, str | None]] = {
    "BOOL": (8, "bool"), "U8": (8, "uint8"), "I8": (8, "int8"), "I16": (16, "int16"), "U16": (16, "uint16"),
    "I32": (32, "int32"), "U32": (32, "uint32"), "I64": (64, "int64"), "U64": (64, "uint64"),
    "F16": (16, "float16"), "BF16": (16, "bfloat16"), "F32": (32, "float32"), "F64": (64, "float64"),
    "C64": (64, "complex64"), "F8_E4M3": (8, "float8_e4m3fn"), "F8_E5M2": (8, "float8_e5m2"),
    "F8_E8M0": (8, "float8_e8m0fnu"), "F8_E4M3FNUZ": (8, "float8_e4m3fnuz"), "F8_E5M2FNUZ": (8, "float8_e5m2fnuz"),
    "F4": (4, "float4_e2m1fn_x2"), "F6_E2M3": (6, None), "F6_E3M2": (6, None),
}  # fmt: skip


def _torch_dtype(name: str) -> DType | None:
    return DTYPES.get(_DTYPES[name][1] or "")


_WIDTH = {name: bits for name, (bits, _) in _DTYPES.items()}
_TORCH_DTYPES = {name: _torch_dtype(name) for name in _DTYPES}
_FIELDS = frozenset({"dtype", "shape", "data_offsets"})


def _BY_OFFSETS(row: tuple[Any, ...]) -> tuple[int, int]:
    return row[0], row[1]


def _sizes(values: list[Any]) -> bool:
    """Every value a JSON integer safetensors accepts as ``usize`` (not bool, float, "-0" or negative)."""
    for v in values:
        if type(v) is not int or not 0 <= v < _U64:
            return False
    return True


class _Refused(ValueError):
    pass


def _no_constant(text: str) -> Any:
    raise _Refused(f"{text} is not JSON")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"number {text[:30]} out of range")
    return value


class _Int(int):
    """An integer literal written with a minus sign (``-0`` included): never a size or an offset."""


def _int(text: str) -> int:
    return _Int(text) if text.startswith("-") else int(text)


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    for key, value in pairs:  # JSON's "\ud800" alone is no character: serde_json refuses it, Python keeps it
        for text in (key, value) if isinstance(value, str) else (key,):
            if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
                raise _Refused("a string holds a lone surrogate escape")
    return dict(pairs)


def _depth(doc: Any) -> int:
    deepest, stack = 0, [(doc, 1)]
    while stack:
        obj, d = stack.pop()
        deepest = max(deepest, d)
        if d > _MAX_JSON_DEPTH:
            break
        if isinstance(obj, dict):
            stack.extend((v, d + 1) for v in obj.values())
        elif isinstance(obj, list):
            stack.extend((v, d + 1) for v in obj)
    return deepest


def _size(value: Any) -> int | None:
    """A JSON integer safetensors accepts as ``usize``, else None."""
    if type(value) is not int or not 0 <= value < _U64:  # bool, float, _Int ("-0"), negatives, strings
        return None
    return value


_ODD = rb"[\[,:]\s*-|\\u[dD][89a-fA-F]"  # a negative number literal, or a surrogate escape


def _parse_header(raw: bytes, label: str) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
        # rare: parse with the hooks that tell "-0" from 0 and a lone surrogate from a pair (two plain byte searches
        # first: the pattern's scan of a 20 MB header costs more than parsing it)
        if (b"-" in raw or b"\\u" in raw) and re.search(_ODD, raw):  # compiled when first needed
            header = json.loads(text, parse_constant=_no_constant, parse_float=_float, parse_int=_int,
                                object_pairs_hook=_pairs)
        else:
            header = json.loads(text, parse_constant=_no_constant, parse_float=_float)
    except UnicodeDecodeError:
        raise CheckpointError(f"{label}: corrupted safetensors header (not UTF-8); safe_open refuses it") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and _Refused are ValueErrors
        raise CheckpointError(f"{label}: corrupted safetensors header ({str(exc)[:100]}); safe_open refuses it") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{label}: corrupted safetensors header (not a JSON object); safe_open refuses it")
    return header


def _bits(shape: tuple[int, ...], width: int) -> int | None:
    """Bits a tensor of ``shape`` holds, None past what 64-bit offsets address (never a huge product: a
    60,000-dimension shape of 2**64 - 1 each is refused at the second dimension)."""
    if 0 in shape:
        return 0
    bits = width
    for d in shape:
        bits *= d
        if bits >= _U64 * 8:
            return None
    return bits


def _bad(label: str, key: str, why: str) -> CheckpointError:
    return CheckpointError(f"{label}: corrupted safetensors header: tensor {shown(key)} {why}; safe_open refuses it")


def _dims(shape: tuple[int, ...]) -> str:
    from torchdoctor._checkpoint.views import dims_text  # a refusal's message only: a good header never needs it

    return dims_text(shape)


def read_safetensors(path: str, fh: IO[bytes], size: int, label: str) -> FileScan:
    """The tensors a safetensors file describes; a header ``safe_open`` would refuse raises ``CheckpointError``."""
    if size < 8:
        raise CheckpointError(f"{label}: truncated safetensors file ({size} bytes, the header length alone needs 8)")
    (n,) = struct.unpack("<Q", fh.read(8))
    if n > MAX_HEADER:
        raise CheckpointError(f"{label}: refused: safetensors header of {n:,} bytes, more than the "
                              f"{MAX_HEADER:,} safe_open accepts")
    if 8 + n > size:
        raise CheckpointError(f"{label}: truncated or corrupted safetensors: header of {n} bytes, file has {size}")
    raw = fh.read(n)
    count = raw.count(b'"data_offsets"')  # before parsing: JSON of a million tensors takes seconds to parse
    if count > MAX_TENSORS:
        raise CheckpointError(f"{label}: refused: a safetensors header of {count:,} tensors, more than the "
                              f"{MAX_TENSORS:,} torchdoctor reads per file (no model file holds that many)")
    header = _parse_header(raw, label)
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise CheckpointError(f"{label}: corrupted safetensors header: __metadata__ must map strings to strings; "
                              "safe_open refuses it")
    data_size = size - 8 - n
    rows: list[tuple[int, int, str, str, tuple[int, ...]]] = []
    # One pass per tensor, written out (no generator per shape, no set per key): a 200,000-tensor header is read
    # in about a second.
    for key, info in header.items():
        if type(info) is not dict or not info.keys() >= _FIELDS:
            raise _bad(label, key, "needs dtype, shape and data_offsets")
        if len(info) > 3 and _depth(info) > _MAX_JSON_DEPTH - 1:  # extra fields are free-form JSON
            raise CheckpointError(f"{label}: corrupted safetensors header (nested deeper than {_MAX_JSON_DEPTH}); "
                                  "safe_open refuses it")
        dtype_name, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if type(dtype_name) is not str or dtype_name not in _DTYPES:
            raise _bad(label, key, f"has unknown dtype {str(dtype_name)[:20]!r}")
        if type(shape) is not list or not _sizes(shape):
            raise _bad(label, key, f"has shape {str(shape)[:40]}, not a list of non-negative integers")
        if type(offsets) is not list or len(offsets) != 2 or not _sizes(offsets):
            raise _bad(label, key, f"has data_offsets {str(offsets)[:40]}, not two non-negative integers")
        rows.append((offsets[0], offsets[1], key, dtype_name, tuple(shape)))
    rows.sort(key=_BY_OFFSETS)
    entries: list[Entry] = []
    spans: dict[str, tuple[int, int]] = {}
    notes: list[str] = []
    start = 0
    new_entry = tuple.__new__  # Entry(...) through its generated __new__ costs a Python call per tensor
    for begin, end, key, dtype_name, shape in rows:
        if begin != start or end < begin:
            what = "overlaps another tensor" if begin < start else "leaves a gap before it"
            raise _bad(label, key, f"has offsets {begin}..{end}: it {what} (tensors must tile the data region)")
        start = end
        length = end - begin
        bits = _bits(shape, _WIDTH[dtype_name])
        if bits is None:
            raise _bad(label, key, f"{dtype_name}{_dims(shape)} is too large to address")
        if bits != length * 8:
            raise _bad(label, key, f"{dtype_name}{_dims(shape)} needs {bits / 8:g} bytes, its offsets span "
                                   f"{length}")
        dtype = _TORCH_DTYPES[dtype_name]
        if dtype is None:
            notes.append(f"{clipped(key)}: dtype {dtype_name} has no torch dtype; shown as uint8")
            dtype = UINT8
        spans[key] = (8 + n + begin, length)
        entries.append(new_entry(Entry, (key, role_of(key), dtype, shape, length, "cpu", key, length, ())))
    if start != data_size:
        raise CheckpointError(
            f"{label}: {'truncated' if start > data_size else 'corrupted'} safetensors: the tensors cover "
            f"{start:,} data bytes, the file holds {data_size:,}; safe_open refuses it"
        )

    def small(key: str) -> bytes | None:
        begin, length = spans[key]
        if length > SMALL_READ:
            return None
        with open(path, "rb") as f:
            f.seek(begin)
            return f.read(length)

    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    return FileScan(path, label, "safetensors", entries, meta, notes=notes, small=small)
