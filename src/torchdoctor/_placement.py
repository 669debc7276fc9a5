"""The device and dtype vocabulary: parse, normalise, compare and print devices and dtypes — the only place.

``cuda`` is ``cuda:0`` in every message, ``cpu`` stays bare, dtypes print without the ``torch.`` prefix, and
``bf16[320]@cuda:0`` is the compact form of a tensor used everywhere. A virtual tensor (``torchdoctor._virtual``)
reports its virtual device through ``.device``; :func:`tensor_device` is how every checker reads a device.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

# One table: dtype name -> short form. Built with getattr so older torch builds without float8 still import.
_SHORT_NAMES = {
    "float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "float8_e4m3fn": "f8e4m3",
    "float8_e5m2": "f8e5m2", "float8_e4m3fnuz": "f8e4m3fnuz", "float8_e5m2fnuz": "f8e5m2fnuz",
    "float8_e8m0fnu": "f8e8m0", "float4_e2m1fn_x2": "f4x2", "complex64": "c64", "complex128": "c128",
    "complex32": "c32", "int8": "i8", "uint8": "u8", "int16": "i16", "uint16": "u16", "int32": "i32",
    "uint32": "u32", "int64": "i64", "uint64": "u64", "bool": "bool", "quint8": "qu8", "qint8": "qi8",
    "qint32": "qi32",
}
_DTYPE_SHORT: dict[torch.dtype, str] = {}
_DTYPE_BY_NAME: dict[str, torch.dtype] = {}
for _name, _short in _SHORT_NAMES.items():
    _dt = getattr(torch, _name, None)
    if isinstance(_dt, torch.dtype):
        _DTYPE_SHORT[_dt] = _short
        _DTYPE_BY_NAME[_name] = _dt
        _DTYPE_BY_NAME[_short] = _dt
for _alias, _name in {
    "float": "float32", "fp32": "float32", "half": "float16", "fp16": "float16", "bf16": "bfloat16",
    "double": "float64", "fp64": "float64", "fp8": "float8_e4m3fn", "long": "int64", "int": "int32",
}.items():
    if _name in _DTYPE_BY_NAME:
        _DTYPE_BY_NAME[_alias] = _DTYPE_BY_NAME[_name]

# float8 storage: never part of type promotion; with float4, packed storage that has no dtype expectation
FLOAT8_DTYPES = frozenset(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                                       "float8_e5m2fnuz", "float8_e8m0fnu") if hasattr(torch, n))
PACKED_DTYPES = FLOAT8_DTYPES | frozenset(getattr(torch, n) for n in ("float4_e2m1fn_x2",) if hasattr(torch, n))

# Device types whose bare name means index 0 in every message (as torch does for the current device).
_INDEXED_TYPES = frozenset({"cuda", "xpu", "mps", "hpu", "npu", "mtia", "privateuseone", "xla"})


_DEVICE_STR: dict[object, str] = {}
_META = torch.device("meta")


def _release(version: str) -> tuple[int, ...]:
    """``"2.5.0a0+git1"`` -> ``(2, 5, 0)``: the numeric release, pre-release tags dropped."""
    out = []
    for part in version.split("+")[0].split("."):
        m = re.match(r"\d+", part)
        if m is None:
            break
        out.append(int(m.group()))
        if m.end() != len(part):
            break
    return tuple(out)


def require_torch(feature: str, minimum: str, *, available: bool | None = None) -> None:
    """Raise a clear error when ``feature`` needs a newer torch than the installed one.

    The package supports torch >= 2.4; a feature built on a newer API calls this before using it. ``available``
    (for example ``hasattr(torch.utils, "module_tracker")``) wins over the version comparison when given, so
    backports and nightly builds are judged by what they have.

    >>> require_torch("scan", "2.4")
    >>> require_torch("time travel", "99.0")
    Traceback (most recent call last):
    ...
    RuntimeError: time travel needs torch 99.0 or newer; this is torch ...
    """
    have = str(torch.__version__)
    ok = available if available is not None else _release(have) >= _release(minimum)
    if not ok:
        raise RuntimeError(
            f"{feature} needs torch {minimum} or newer; this is torch {have}. The rest of torchdoctor works on "
            f"torch >= 2.4. To use {feature}, install a newer torch build for your accelerator first "
            "(https://pytorch.org/get-started/locally/), then reinstall torchdoctor."
        )


def dtype_str(dtype: torch.dtype | None) -> str:
    """``torch.bfloat16`` -> ``'bfloat16'``.

    >>> dtype_str(torch.bfloat16)
    'bfloat16'
    """
    if dtype is None:
        return "none"
    return str(dtype).removeprefix("torch.")


def device_str(device: torch.device | str | int | None) -> str:
    """A device as JSON and messages show it: explicit index for accelerators, ``cpu`` and ``meta`` bare.

    >>> device_str("cuda"), device_str(torch.device("cpu")), device_str("mps")
    ('cuda:0', 'cpu', 'mps:0')
    """
    if device is None:
        return "none"
    cached = _DEVICE_STR.get(device)  # type: ignore[call-overload]
    if cached is not None:
        return cached
    d = device if isinstance(device, torch.device) else torch.device(device)
    text = f"{d.type}:0" if d.index is None and d.type in _INDEXED_TYPES else str(d)
    if len(_DEVICE_STR) < 4096:
        _DEVICE_STR[device] = text
    return text


_PLAIN_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})


def tensor_device(t: torch.Tensor) -> torch.device:
    """The device a tensor stands for: a virtual tensor's ``_td_device``, a FakeTensor's ``fake_device``, else
    ``t.device``. Every checker reads devices through this one function (per aten op in strict mode: plain
    tensors and parameters take the short way)."""
    if type(t) in _PLAIN_TENSORS and "_td_device" not in t.__dict__:
        return t.device
    d = getattr(t, "_td_device", None)
    if d is not None:
        return d if isinstance(d, torch.device) else torch.device(d)
    d = getattr(t, "fake_device", None)
    if d is not None:
        return d
    return t.device


def norm_device(d: torch.device) -> torch.device:
    """``cuda`` is ``cuda:0`` (as torch means the current device); ``cpu`` and ``meta`` stay bare.

    >>> norm_device(torch.device("cuda")), norm_device(torch.device("cpu"))
    (device(type='cuda', index=0), device(type='cpu'))
    """
    if d.index is None and d.type not in ("cpu", "meta"):
        return torch.device(d.type, 0)
    return d


def same_device(a: torch.device, b: torch.device) -> bool:
    """``cuda`` and ``cuda:0`` are the same device; ``cpu`` and ``cpu:0`` too."""
    if a.type != b.type:
        return False
    return (a.index or 0) == (b.index or 0)


def parse_device(value: str | torch.device | int) -> torch.device:
    """Parse a device argument, with an error that says what is accepted.

    >>> parse_device("cuda:1")
    device(type='cuda', index=1)
    """
    if isinstance(value, torch.device):
        return value
    try:
        return torch.device(value)
    except (RuntimeError, TypeError, ValueError) as exc:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            raise ValueError(
                f"device index {value} means device {value} of the current accelerator, and torch sees no accelerator "
                f"here; name the device instead, e.g. 'cuda:{value}', 'xpu:{value}' or 'mps'."
            ) from exc
        raise ValueError(
            f"not a device: {value!r}. Use a torch device string such as 'cpu', 'cuda:0', 'cuda:1', 'xpu', 'mps' or 'meta'."
        ) from exc


def parse_dtype(value: str | torch.dtype) -> torch.dtype:
    """Parse a dtype argument: ``bfloat16``, ``bf16``, ``torch.float16``, ``half`` ...

    >>> parse_dtype("bf16"), parse_dtype("torch.float16")
    (torch.bfloat16, torch.float16)
    """
    if isinstance(value, torch.dtype):
        return value
    key = str(value).strip().removeprefix("torch.").lower()
    dt = _DTYPE_BY_NAME.get(key)
    if dt is None:
        known = ", ".join(sorted(k for k in _SHORT_NAMES if k in _DTYPE_BY_NAME)[:12])
        raise ValueError(f"not a dtype: {value!r}. Use a torch dtype name such as {known}, or bf16 / fp16 / fp32.")
    return dt


def compact(dtype: torch.dtype | None, shape: Sequence[int] | None, device: torch.device | str | None) -> str:
    """The compact form of a tensor in every message: ``bf16[320]@cuda:0``.

    >>> compact(torch.bfloat16, (320,), "cuda")
    'bf16[320]@cuda:0'
    >>> compact(torch.float32, (), "cpu")
    'f32[]@cpu'
    >>> compact(torch.float32, (torch.tensor(73), torch.tensor(4)), "cpu")  # sizes read under torch.jit.trace
    'f32[73,4]@cpu'
    """
    key = (dtype, shape, device)
    try:
        text = _COMPACT.get(key)
    except TypeError:  # a list shape or symbolic sizes do not hash
        return _compact(dtype, shape, device)
    if text is None:  # layers repeat their shapes: scan, move and every message ask for the same few forms
        if len(_COMPACT) > 8192:
            _COMPACT.clear()
        text = _COMPACT[key] = _compact(dtype, shape, device)
    return text


_COMPACT: dict[tuple[Any, ...], str] = {}


def _compact(dtype: torch.dtype | None, shape: Sequence[int] | None, device: torch.device | str | None) -> str:
    short = _DTYPE_SHORT.get(dtype, dtype_str(dtype)) if dtype is not None else "?"  # type: ignore[arg-type]
    dims = "" if shape is None else ",".join(map(_dim, shape))
    return f"{short}[{dims}]@{device_str(device)}"


def _dim(d: Any) -> str:
    """One size as a number: under ``torch.jit.trace`` sizes are 0-dim tensors (``tensor(73)`` is ``73``)."""
    if isinstance(d, torch.Tensor):
        try:
            return str(int(d))
        except Exception:  # a size without a value (meta): its place is still shown
            return "?"
    return str(d)


def short_dtype(dtype: torch.dtype) -> str:
    return _DTYPE_SHORT.get(dtype, dtype_str(dtype))


