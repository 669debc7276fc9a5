"""The one result model every verb speaks: tensors, problems, errors, targets, JSON and the compact text form.

Device and dtype meaning lives here too (STYLE 11): ``cuda`` is ``cuda:0``, dtypes print without the
``torch.`` prefix, and ``bf16[320]@cuda:0`` is the compact form used in every message.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "EXIT_OK", "EXIT_PROBLEMS", "EXIT_USAGE", "KINDS", "ROLES", "PlacementError", "PlacementWarning", "Problem",
    "ScanReport", "Target", "TensorInfo", "compact", "device_str", "dtype_str", "format_error", "parse_device",
    "parse_dtype", "require_torch", "schema",
]

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2

ROLES = ("parameter", "buffer", "attribute", "quant_state", "subclass_inner", "container", "offloaded")
KINDS = ("device", "dtype", "meta", "saved_device", "quant_incomplete", "unsafe_global", "unsupported_dtype",
         "unsupported_op", "truncated")

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

# Device types whose bare name means index 0 in every message (as torch does for the current device).
_INDEXED_TYPES = frozenset({"cuda", "xpu", "mps", "hpu", "npu", "mtia", "privateuseone", "xla"})


_DEVICE_STR: dict[object, str] = {}
_META = torch.device("meta")
_COMPACT: dict[tuple[Any, ...], str] = {}  # (dtype, shape, device) -> compact form; shapes repeat across layers


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


def schema(verb: str) -> str:
    """The ``schema`` value of a verb's JSON document.

    >>> schema("scan")
    'torchdoctor/scan/1'
    """
    return f"torchdoctor/{verb}/1"


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
    """
    short = _DTYPE_SHORT.get(dtype, dtype_str(dtype)) if dtype is not None else "?"  # type: ignore[arg-type]
    dims = "" if shape is None else ",".join(map(str, shape))
    return f"{short}[{dims}]@{device_str(device)}"


def short_dtype(dtype: torch.dtype) -> str:
    return _DTYPE_SHORT.get(dtype, dtype_str(dtype))


@dataclass(frozen=True)
class TensorInfo:
    """One tensor reachable from an object, at one path."""

    path: str
    role: str
    device: torch.device
    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int
    moved_by_module_to: bool
    alias_of: str | None = None

    def __init__(self, path: str, role: str, device: torch.device, dtype: torch.dtype, shape: tuple[int, ...],
                 nbytes: int, moved_by_module_to: bool, alias_of: str | None = None) -> None:
        # One dict store instead of eight frozen __setattr__ calls: scan builds one row per tensor path, and on a
        # 70B-shaped model the generated __init__ alone cost a third of a bare named_parameters() loop.
        object.__setattr__(self, "__dict__", {
            "path": path, "role": role, "device": device, "dtype": dtype, "shape": shape, "nbytes": nbytes,
            "moved_by_module_to": moved_by_module_to, "alias_of": alias_of})

    @property
    def compact(self) -> str:
        key = (self.dtype, self.shape, self.device)
        text = _COMPACT.get(key)
        if text is None:
            text = compact(self.dtype, self.shape, self.device)
            if len(_COMPACT) > 8192:
                _COMPACT.clear()
            _COMPACT[key] = text
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "role": self.role,
            "device": device_str(self.device),
            "dtype": dtype_str(self.dtype),
            "shape": list(self.shape),
            "nbytes": self.nbytes,
            "moved_by_module_to": self.moved_by_module_to,
            "alias_of": self.alias_of,
        }

    @classmethod
    def of(cls, path: str, tensor: torch.Tensor, role: str = "attribute", moved_by_module_to: bool = False) -> TensorInfo:
        return cls(
            path,
            role,
            tensor.device,
            tensor.dtype,
            tuple(tensor.shape),
            tensor.nelement() * tensor.element_size(),
            moved_by_module_to,
        )


@dataclass(frozen=True)
class Problem:
    """One finding. ``found`` / ``expected`` are short strings (``cuda:0``, ``bfloat16``, compact forms)."""

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

    def __init__(self, kind: str, path: str, role: str, found: str, expected: str, message: str, op: str | None = None,
                 module_path: str | None = None, module_type: str | None = None, tensors: tuple[str, ...] = ()) -> None:
        # see TensorInfo.__init__: a model built on meta gives one Problem per tensor
        object.__setattr__(self, "__dict__", {
            "kind": kind, "path": path, "role": role, "found": found, "expected": expected, "message": message,
            "op": op, "module_path": module_path, "module_type": module_type, "tensors": tensors})

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tensors"] = list(self.tensors)
        return d

    def __str__(self) -> str:
        return f"{self.kind:<8} {self.path}: {self.message}"


def format_error(headline: str, culprits: Iterable[str] = (), fix: str | None = None, limit: int = 20) -> str:
    """Errors have one shape (STYLE 7): headline, culprits, then the fix as code to paste."""
    lines = [headline]
    items = list(culprits)
    for c in items[:limit]:
        lines.append(f"  {c}")
    if len(items) > limit:
        lines.append(f"  ... and {len(items) - limit} more")
    if fix:
        lines.append("Fix:")
        lines.extend(f"    {ln}" for ln in fix.splitlines())
    return "\n".join(lines)


class PlacementError(RuntimeError):
    """A tensor is on the wrong device or in the wrong dtype; says which module, which tensors and the fix."""

    def __init__(
        self,
        message: str,
        *,
        module_path: str | None = None,
        module_type: str | None = None,
        op: str | None = None,
        tensors: Sequence[Any] = (),
        problems: Sequence[Problem] = (),
        fix: str | None = None,
    ) -> None:
        super().__init__(message)
        self.module_path = module_path
        self.module_type = module_type
        self.op = op
        self.tensors = tuple(tensors)
        self.problems = tuple(problems)
        self.fix = fix


class PlacementWarning(UserWarning):
    """A placement problem that was reported and then let through (guard ``warn`` mode, soft findings)."""


PlacementError.__module__ = "torchdoctor"
PlacementWarning.__module__ = "torchdoctor"


@dataclass
class Target:
    """What a CLI target or a test hands to the verbs: the object and, optionally, call arguments."""

    obj: Any
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


Target.__module__ = "torchdoctor"


def _storage_key(info: TensorInfo, tensor: torch.Tensor | None) -> Any:
    if tensor is None or info.device == _META:
        return None
    try:
        st = tensor.untyped_storage()
        return (info.device, st.data_ptr(), st.nbytes())
    except Exception:
        return None


@dataclass
class ScanReport:
    """What ``scan`` found: ``.ok``, ``.problems``, ``.tensors`` (one row per path), ``.summary``, ``.to_dict()``."""

    tensors: tuple[TensorInfo, ...]
    problems: tuple[Problem, ...]
    expected: dict[str, dict[str, str]] = field(default_factory=dict)
    source: str | None = None
    truncated: bool = False
    summary: tuple[dict[str, Any], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    verb: str = "scan"

    @property
    def ok(self) -> bool:
        return not self.problems

    def __bool__(self) -> bool:  # ``if report:`` reads as "is it fine"
        return self.ok

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "schema": schema(self.verb),
            "ok": self.ok,
            "source": self.source,
            "truncated": self.truncated,
            "expected": self.expected,
            "problems": [p.to_dict() for p in self.problems],
            "summary": list(self.summary),
            "tensors": [t.to_dict() for t in self.tensors],
        }
        doc.update(self.extra)
        return doc

    def text(self, limit: int = 40) -> str:
        return render_report(self, limit=limit)

    def __str__(self) -> str:
        return self.text()


def summarize(rows: Iterable[tuple[TensorInfo, torch.Tensor | None]]) -> tuple[dict[str, Any], ...]:
    """Group by (device, dtype), counting each storage once (tied weights, views, aliases)."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}  # -> [tensors, nbytes]
    seen: set[Any] = set()
    for info, tensor in rows:
        if info.alias_of is not None:
            continue
        if tensor is not None and info.device != _META:  # not ``.type``: it builds a new string per call
            key = _storage_key(info, tensor)
            if key is not None:
                if key in seen:
                    continue
                seen.add(key)
        g = groups.get((info.device, info.dtype))
        if g is None:
            g = groups[(info.device, info.dtype)] = [0, 0]
        g[0] += 1
        g[1] += info.nbytes
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for (dev, dt), (n, nbytes) in groups.items():
        key = (device_str(dev), dtype_str(dt))  # cuda and cuda:0 are one group
        m = merged.setdefault(key, {"device": key[0], "dtype": key[1], "tensors": 0, "nbytes": 0})
        m["tensors"] += n
        m["nbytes"] += nbytes
    return tuple(sorted(merged.values(), key=lambda g: -g["nbytes"]))


def human_bytes(n: int) -> str:
    """
    >>> human_bytes(1536)
    '1.5 KiB'
    """
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def render_problems(problems: Sequence[Problem], limit: int = 40) -> list[str]:
    lines = []
    ordered = sorted(problems, key=lambda p: (p.kind == "truncated", p.path))
    for p in ordered[:limit]:
        lines.append(f"  {p.kind:<16} {p.path}  {p.message}")
    if len(ordered) > limit:
        lines.append(f"  ... and {len(ordered) - limit} more problems (use --json for all)")
    return lines


def render_report(report: ScanReport, limit: int = 40) -> str:
    """Problems first, by path, then the compact summary."""
    lines: list[str] = []
    head = report.source or "object"
    n_alias = sum(1 for t in report.tensors if t.alias_of)
    if report.problems:
        lines.append(f"{len(report.problems)} problem(s) in {head}:")
        lines.extend(render_problems(report.problems, limit))
    else:
        lines.append(f"ok: no placement problems in {head}")
    if report.expected:
        exp = ", ".join(
            f"{name or '<root>'}: {e.get('device', '?')} {e.get('dtype', '?')}" for name, e in list(report.expected.items())[:8]
        )
        more = f" (+{len(report.expected) - 8} more)" if len(report.expected) > 8 else ""
        lines.append(f"expected: {exp}{more}")
    lines.append(f"{len(report.tensors)} tensor paths ({n_alias} aliases); by device and dtype, each storage once:")
    for g in report.summary[:limit]:
        lines.append(f"  {g['device']:<8} {g['dtype']:<14} {g['tensors']:>7} tensors  {human_bytes(g['nbytes']):>11}")
    if len(report.summary) > limit:
        lines.append(f"  ... and {len(report.summary) - limit} more groups")
    return "\n".join(lines)
