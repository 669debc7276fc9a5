"""Dtypes and saved locations as a checkpoint names them, without importing torch.

Reading a checkpoint needs only names: ``torch.HalfStorage`` holds float16, a safetensors ``BF16`` is bfloat16,
``cuda:1`` is a location. :class:`DType` prints as ``torch.float16`` (as ``torch.dtype`` does), so every message
reads the same with or without torch; the Python API turns it into ``torch.dtype`` at its boundary
(:func:`to_torch`), the command line never does.

>>> DTYPES["bfloat16"], DTYPES["bfloat16"].itemsize, DTYPES["int8"].is_floating_point
(torch.bfloat16, 2, False)
>>> location_str("cuda"), location_str("cpu"), location_str("weird:place")
('cuda:0', 'cpu', 'weird:place')
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

__all__ = [
    "BOOL", "DTYPES", "DType", "FLOAT16", "BFLOAT16", "FLOAT32", "INT8", "STORAGE_DTYPES", "UINT8", "from_torch",
    "clipped", "location_str", "location_type", "majority_dtype", "parse_dtype", "parse_location", "shown",
    "to_torch",
]  # fmt: skip


class DType:
    """A dtype by name: size in bytes (1 for sub-byte and bit types, as torch says), float or complex."""

    __slots__ = ("name", "itemsize", "is_floating_point", "is_complex")

    def __init__(self, name: str, itemsize: int, floating: bool = False, complex_: bool = False) -> None:
        self.name, self.itemsize, self.is_floating_point, self.is_complex = name, itemsize, floating, complex_

    def __repr__(self) -> str:
        return f"torch.{self.name}"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        return (_by_name, (self.name,))


def _by_name(name: str) -> DType:
    return DTYPES[name]


def _table() -> dict[str, DType]:
    table = {}
    for name, size in (("float16", 2), ("bfloat16", 2), ("float32", 4), ("float64", 8)):
        table[name] = DType(name, size, floating=True)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
                 "float4_e2m1fn_x2"):
        table[name] = DType(name, 1, floating=True)
    for name, size in (("complex32", 4), ("complex64", 8), ("complex128", 16)):
        table[name] = DType(name, size, complex_=True)
    for bits in (8, 16, 32, 64):
        table[f"int{bits}"] = DType(f"int{bits}", bits // 8)
        table[f"uint{bits}"] = DType(f"uint{bits}", bits // 8)
    for bits in range(1, 8):
        table[f"int{bits}"] = DType(f"int{bits}", 1)
        table[f"uint{bits}"] = DType(f"uint{bits}", 1)
    for name, size in (("bool", 1), ("quint8", 1), ("qint8", 1), ("qint32", 4), ("quint4x2", 1), ("quint2x4", 1),
                       ("bits1x8", 1), ("bits2x4", 1), ("bits4x2", 1), ("bits8", 1), ("bits16", 2)):
        table[name] = DType(name, size)
    return table


DTYPES: dict[str, DType] = _table()
FLOAT16, BFLOAT16, FLOAT32 = DTYPES["float16"], DTYPES["bfloat16"], DTYPES["float32"]
INT8, UINT8, BOOL = DTYPES["int8"], DTYPES["uint8"], DTYPES["bool"]

# torch.<Name>Storage -> the dtype it holds (torch.storage._dtype_to_storage_type_map, inverted)
STORAGE_DTYPES: dict[str, DType] = {f"{k}Storage": DTYPES[v] for k, v in {
    "Double": "float64", "Float": "float32", "Half": "float16", "Long": "int64", "Int": "int32", "Short": "int16",
    "Char": "int8", "Byte": "uint8", "Bool": "bool", "BFloat16": "bfloat16", "ComplexDouble": "complex128",
    "ComplexFloat": "complex64", "QUInt8": "quint8", "QInt8": "qint8", "QInt32": "qint32", "QUInt4x2": "quint4x2",
    "QUInt2x4": "quint2x4",
}.items()}  # fmt: skip


def to_torch(dtype: DType) -> Any:
    """The ``torch.dtype`` of the same name (imports torch: the Python API's boundary only)."""
    import torch

    value = getattr(torch, dtype.name, None)
    return value if isinstance(value, torch.dtype) else torch.uint8


def from_torch(dtype: Any) -> DType:
    """A ``torch.dtype`` (or its name) as a :class:`DType`."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"not a dtype: {dtype!r}")
    return DTYPES[name]


# the device types torch.device parses (c10/core/DeviceType.cpp), and those shown with an index when saved bare
_DEVICE_TYPES = frozenset(
    "cpu cuda ipu xpu mkldnn opengl opencl ideep hip ve fpga maia xla lazy vulkan mps meta hpu mtia "
    "privateuseone".split()
)
_INDEXED_TYPES = frozenset({"cuda", "xpu", "mps", "hpu", "npu", "mtia", "privateuseone", "xla"})
_LOCATION = r"([a-z_]+)(?::(0|[1-9][0-9]{0,8}))?"


@functools.lru_cache(maxsize=256)
def parse_location(location: str) -> tuple[str, int | None] | None:
    """``cuda:1`` -> ``("cuda", 1)``; None for a location ``torch.device`` would not parse."""
    if location in _DEVICE_TYPES:  # ``cpu``, as nearly every file says: no pattern to compile on a first scan
        return location, None
    m = re.fullmatch(_LOCATION, location)  # compiled on first use (re's cache), not at import
    if m is None or m.group(1) not in _DEVICE_TYPES:
        return None
    return m.group(1), None if m.group(2) is None else int(m.group(2))


def location_type(location: str) -> str | None:
    parsed = parse_location(location)
    return parsed[0] if parsed else None


@functools.lru_cache(maxsize=256)
def location_str(location: str) -> str:
    """A saved location as device text (``cuda`` reads ``cuda:0``); one torch cannot parse stays as saved."""
    parsed = parse_location(location)
    if parsed is None:
        return location
    kind, index = parsed
    if index is None:
        return f"{kind}:0" if kind in _INDEXED_TYPES else kind
    return f"{kind}:{index}"


_SHORT = {
    "f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64", "f8e4m3": "float8_e4m3fn",
    "f8e5m2": "float8_e5m2", "f8e4m3fnuz": "float8_e4m3fnuz", "f8e5m2fnuz": "float8_e5m2fnuz",
    "f8e8m0": "float8_e8m0fnu", "f4x2": "float4_e2m1fn_x2", "c64": "complex64", "c128": "complex128",
    "c32": "complex32", "i8": "int8", "u8": "uint8", "i16": "int16", "u16": "uint16", "i32": "int32",
    "u32": "uint32", "i64": "int64", "u64": "uint64", "qu8": "quint8", "qi8": "qint8", "qi32": "qint32",
    "float": "float32", "fp32": "float32", "half": "float16", "fp16": "float16", "double": "float64",
    "fp64": "float64", "fp8": "float8_e4m3fn", "long": "int64", "int": "int32",
}  # fmt: skip  -- the names and aliases torchdoctor._placement.parse_dtype accepts
_NAMES = frozenset(
    "float32 float16 bfloat16 float64 float8_e4m3fn float8_e5m2 float8_e4m3fnuz float8_e5m2fnuz float8_e8m0fnu "
    "float4_e2m1fn_x2 complex64 complex128 complex32 int8 uint8 int16 uint16 int32 uint32 int64 uint64 bool quint8 "
    "qint8 qint32".split()
)


def parse_dtype(value: Any) -> DType:
    """A dtype argument (``bfloat16``, ``bf16``, ``torch.float16``, ``half``), as ``_placement.parse_dtype`` reads it.

    >>> parse_dtype("bf16"), parse_dtype("torch.float16")
    (torch.bfloat16, torch.float16)
    """
    key = str(value).strip().removeprefix("torch.").lower()
    name = _SHORT.get(key, key)
    if name not in _NAMES:
        known = ", ".join(sorted(_NAMES)[:12])
        raise ValueError(f"not a dtype: {value!r}. Use a torch dtype name such as {known}, or bf16 / fp16 / fp32.")
    return DTYPES[name]


def clipped(text: str, limit: int = 120) -> str:
    """Text from a file shortened past ``limit`` characters, its length said (escaping is the renderer's)."""
    return text if len(text) <= limit else f"{text[:60]}...({len(text):,} characters)"


def shown(name: Any, limit: int = 120) -> str:
    """A name from a file as messages print it: ``repr`` (escaped), shortened past ``limit`` characters.

    >>> shown("model.w"), shown("x" * 10**6)[-30:]
    ("'model.w'", "xxx...' (1,000,000 characters)")
    """
    text = str(name)
    quoted = repr(text[:limit])
    if len(text) <= limit and len(quoted) <= limit + 40:
        return quoted
    return repr(text[:60])[:60] + f"...' ({len(text):,} characters)"


def majority_dtype(dtypes: Sequence[DType]) -> tuple[DType, int, int] | None:
    """The most common floating dtype among ``dtypes`` by count (float8 storage excluded), with counts.

    >>> majority_dtype([DTYPES["bfloat16"], DTYPES["bfloat16"], DTYPES["float32"], DTYPES["int64"]])
    (torch.bfloat16, 2, 3)
    """
    floats = [d for d in dtypes if d.is_floating_point and d.itemsize > 1]
    if not floats:
        return None
    counts: dict[DType, int] = {}
    for d in floats:
        counts[d] = counts.get(d, 0) + 1
    best = max(counts, key=lambda d: counts[d])
    return best, counts[best], len(floats)
