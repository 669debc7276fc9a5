"""What is wrong with a checkpoint, from its records alone: saved devices, dtypes, quantization state,
unsafe pickle globals.

:mod:`torchdoctor._checkpoint` reads the files into the records defined here (:class:`Entry` per tensor,
:class:`FileScan` per file, :class:`Group` per checkpoint) and asks :func:`group_problems` for the findings.
Quantization checks are data: one function per family in a registry that refuses duplicates.

>>> from torchdoctor._checkpoint.dtypes import FLOAT16, FLOAT32
>>> group = Group("", [FileScan("m.pt", "m.pt", "torch-zip", [
...     Entry("w", "parameter", FLOAT16, (2,), 4, "cpu", "0", 4, ())])])
>>> from torchdoctor._checkpoint.expect import expectation
>>> [p.kind for p in group_problems(group, None, expectation(None, FLOAT32))]
['dtype']
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

from torchdoctor._checkpoint.dtypes import (
    BFLOAT16,
    FLOAT16,
    FLOAT32,
    INT8,
    DType,
    clipped,
    location_str,
    parse_location,
)
from torchdoctor._checkpoint.result import Finding as Problem
from torchdoctor._report.text import human_bytes

# ``devices`` (device counts) and ``unsafe`` (pickle globals, with the allow-list of ``names``) are imported where a
# file needs them: a safetensors file saved on cpu needs neither (docs/checkpoints.md, "Cost").

__all__ = ["Entry", "FileScan", "Group", "group_problems", "loc_str", "role_of", "truncated_problem"]

loc_str = location_str


# Last key component -> quantization family; these keys are metadata, not weights (role ``quant_state``).
_QUANT_NAMES = {
    "absmax": "bnb4", "quant_map": "bnb4", "nested_absmax": "bnb4", "nested_quant_map": "bnb4",
    "SCB": "bnb8", "weight_format": "bnb8",
    "qzeros": "gptq", "scales": "gptq", "g_idx": "gptq",
    "weight_scale": "fp8", "weight_scale_inv": "fp8", "input_scale": "fp8", "output_scale": "fp8",
    "weight_zero_point": "fp8", "input_zero_point": "fp8",
    "scale_weight": "fp8", "scale_input": "fp8",  # ComfyUI's fp8_scaled checkpoints: float32 by design
}  # fmt: skip


def role_of(key: str) -> str:
    """A key's role, from its suffix: bitsandbytes / GPTQ / FP8 metadata is ``quant_state``.

    >>> role_of("model.layers.0.mlp.down_proj.weight"), role_of("fc.weight.absmax"), role_of("fc.SCB")
    ('parameter', 'quant_state', 'quant_state')
    >>> role_of("fc.weight.quant_state.bitsandbytes__nf4")
    'quant_state'
    """
    if "quant_state" in key and ".quant_state." in f".{key}.":  # the plain search first: called per tensor
        return "quant_state"
    return "quant_state" if key[key.rfind(".") + 1:] in _QUANT_NAMES else "parameter"


# The record tuples are declared with NamedTuple's call form: the class form's annotations are strings here (PEP 563)
# and typing compiles each one at import, a third of this module's import (issue 28, the first checkpoint scan).
class Entry(NamedTuple("Entry", [
    ("key", str), ("role", str), ("dtype", DType), ("shape", tuple[int, ...]), ("nbytes", int), ("location", str),
    ("storage", str),  # identity of the bytes within the file: shared storages are counted once
    ("storage_nbytes", int), ("view", tuple[Any, ...]),  # view: (offset, shape, stride, dtype) of a pickle's record
])):
    """One tensor in one file, as the file describes it (a tuple: thousands are built per scan). ``view`` is
    ``()`` for a tensor that is its own storage (safetensors, DCP)."""

    __slots__ = ()


def _no_small(key: str) -> bytes | None:
    return None


class FileScan:
    """What one file holds; ``path`` is the file system path, ``label`` how messages name it. ``unsafe``: (global,
    where, call args); ``sharding`` (distributed): key -> chunks; ``failure``: why the pickle stopped loading after
    naming its globals (then it holds no entries). Plain classes here, not dataclasses: see ``stubs.StorageRef``."""

    __slots__ = ("path", "label", "format", "entries", "metadata", "unsafe", "notes", "truncated", "small", "sharding",
                 "failure")

    def __init__(self, path: str, label: str, format: str, entries: list[Entry], metadata: dict[str, Any] | None = None,
                 unsafe: list[tuple[str, str | None, tuple[Any, ...]]] | None = None, notes: list[str] | None = None,
                 truncated: bool = False, small: Callable[[str], bytes | None] = _no_small,
                 sharding: dict[str, list[dict[str, list[int]]]] | None = None, failure: str = "") -> None:
        self.path = path
        self.label = label
        self.format = format
        self.entries = entries
        self.metadata: dict[str, Any] = {} if metadata is None else metadata
        self.unsafe: list[tuple[str, str | None, tuple[Any, ...]]] = [] if unsafe is None else unsafe
        self.notes: list[str] = [] if notes is None else notes
        self.truncated = truncated
        self.small = small
        self.sharding: dict[str, list[dict[str, list[int]]]] = {} if sharding is None else sharding
        self.failure = failure

    def __repr__(self) -> str:
        return f"FileScan(path={self.path!r}, format={self.format!r}, entries={len(self.entries)})"


class Group:
    """One checkpoint: a single file, or the shards of one index. ``prefix`` is prepended to its keys."""

    __slots__ = ("prefix", "files", "index", "index_missing", "index_extra")

    def __init__(self, prefix: str, files: list[FileScan], index: str | None = None,
                 index_missing: list[str] | None = None, index_extra: list[str] | None = None) -> None:
        self.prefix = prefix
        self.files = files
        self.index = index
        self.index_missing: list[str] = [] if index_missing is None else index_missing
        self.index_extra: list[str] = [] if index_extra is None else index_extra

    def __repr__(self) -> str:
        return f"Group(prefix={self.prefix!r}, files={self.files!r}, index={self.index!r})"

    def path_of(self, key: str) -> str:
        key = key or "<root>"
        return f"{self.prefix}/{key}" if self.prefix else key


def _map_location(dev: tuple[str, int | None] | None, want: str | None) -> str:
    import json  # only where a problem is written: a clean file never needs it

    from torchdoctor._checkpoint.devices import device_count

    if want is not None:
        return json.dumps(want)
    if dev is not None and device_count(dev[0]) > 0:  # e.g. saved on cuda:1, this machine has only cuda:0
        return json.dumps({location_str(f"{dev[0]}:{dev[1] or 0}"): f"{dev[0]}:0"})
    return '"cpu"'


def _same(dev: tuple[str, int | None], want: str) -> bool:
    other = parse_location(want)
    return other is not None and other[0] == dev[0] and (other[1] or 0) == (dev[1] or 0)


def _saved_device_problems(group: Group, fs: FileScan, want: str | None) -> list[Problem]:
    by_loc: dict[str, list[Entry]] = {}
    for e in fs.entries:
        by_loc.setdefault(e.location, []).append(e)
    out = []
    for loc, entries in by_loc.items():
        dev = parse_location(loc)
        if dev is not None and dev[0] == "cpu":  # cpu storages load anywhere (and need no device count)
            continue
        from torchdoctor._checkpoint.devices import device_count

        if dev is not None and dev[0] != "meta":
            if _same(dev, want) if want else (dev[1] or 0) < device_count(dev[0]):  # it loads where it was saved
                continue
        paths = tuple(group.path_of(e.key) for e in entries)
        size = human_bytes(sum({e.storage: e.storage_nbytes for e in entries}.values()))
        if dev is not None and dev[0] == "meta":
            msg = (f"{len(paths)} tensor(s) in {fs.label} were saved on meta and hold no data; "
                   "re-save from a model with real weights")
            out.append(Problem("meta", paths[0], entries[0].role, "meta", "a real device", msg, tensors=paths))
            continue
        where = clipped(loc_str(loc), 60)
        if want is not None:
            why = f"you would load on {want}, but torch.load restores them on {where}"
        else:
            n = device_count(dev[0]) if dev is not None else 0
            kind = dev[0].upper() if dev is not None else repr(loc)
            have = f"no {kind} device" if n == 0 else f"{n} {kind} device(s)"
            why = f"this machine has {have}, so torch.load fails (\"Attempting to deserialize object on ...\")"
        import json

        fix = f"torch.load({json.dumps(fs.path)}, map_location={_map_location(dev, want)})"
        msg = f"{len(paths)} tensor(s) ({size}) in {fs.label} were saved on {where}; {why}. Fix: {fix}"
        expected = want if want is not None else "a device this machine has"
        out.append(Problem("saved_device", paths[0], entries[0].role, where, expected, msg, tensors=paths))
    return out


# dtypes a device cannot even hold (the storage rule of torchdoctor._rules.profile.DeviceProfile.supports)
_NO_STORAGE = {"mps": frozenset({"float64", "complex128"})}


def _unsupported_problems(group: Group, entries: list[Entry], want: str | None) -> list[Problem]:
    parsed = parse_location(want) if want is not None else None
    kind = parsed[0] if parsed is not None else None
    never = _NO_STORAGE.get(kind or "", frozenset())
    out = []
    by_dtype: dict[DType, list[Entry]] = {}
    for e in entries:
        if e.dtype.name in never:
            by_dtype.setdefault(e.dtype, []).append(e)
    for dt, es in by_dtype.items():
        paths = tuple(group.path_of(e.key) for e in es)
        msg = (f"{len(paths)} tensor(s) are {dt.name}, which {kind} cannot hold; "
               "convert before moving them there")
        out.append(Problem("unsupported_dtype", paths[0], es[0].role, dt.name, f"a dtype {kind} supports",
                           msg, tensors=paths))
    return out


# a training checkpoint's own state: optimizer moments and steps, loss scales, schedulers keep float32 whatever
# the model's dtype (torch's AdamW keeps ``step`` float32; GradScaler's ``scale`` is float32)
_TRAINING_STATE = (r"(^|\.)(optimizer|optimizers|optimizer_states|optim|scaler|grad_scaler|lr_scheduler|"
                   r"lr_schedulers|scheduler)(\.|$)")


def _training_state(key: str) -> bool:
    return re.search(_TRAINING_STATE, key) is not None  # compiled on first use (re's cache), not at import


def _dtype_problems(group: Group, entries: list[Entry], exp: Any) -> list[Problem]:
    """Floating weights off the expected dtype (``exp``: a DtypeExpectation or None), one problem per dtype
    found. Float8 storage and quantization metadata are never judged; modules the model class keeps in
    float32 are expected float32."""
    if exp is None:
        return []
    want = exp.dtype
    off = [e for e in entries if e.role == "parameter" and e.dtype != want and e.dtype.is_floating_point
           and e.dtype.itemsize > 1 and not _training_state(e.key)]
    if not off:
        return []
    if want in (FLOAT16, BFLOAT16) and any(e.dtype is FLOAT32 for e in off):
        exp = exp.with_kept()  # asks transformers only now, when it can change the verdict
    kept = [e for e in off if e.dtype is FLOAT32 and exp.keeps(e.key)]
    by_dtype: dict[DType, list[Entry]] = {}
    for e in off:
        if not (e.dtype is FLOAT32 and exp.keeps(e.key)):
            by_dtype.setdefault(e.dtype, []).append(e)
    name = want.name
    # float8 weights and their scales (an fp8-scaled checkpoint): a model-wide cast would cast them too
    quantized = any(e.role == "quant_state" or e.dtype.is_floating_point and e.dtype.itemsize == 1 for e in entries)
    out = []
    for dt, es in by_dtype.items():
        paths = tuple(group.path_of(e.key) for e in es)
        size = human_bytes(sum(e.nbytes for e in es))
        where = clipped(paths[0]) if len(paths) == 1 else f"{clipped(paths[0])} and {len(paths) - 1} more"
        msg = (f"{where}: {len(paths)} floating tensor(s) ({size}) are {dt.name}, expected {name} because "
               f"{exp.why}")
        if exp.kept_why:
            msg += f" ({exp.kept_why}{f': {len(kept)} such tensor(s) are float32 as expected' if kept else ''})"
        if quantized:
            msg += (f"; cast only these tensors to {name} when loading: the file also holds float8 or quantized "
                    f"weights and their float32 scales, which a model-wide model.to(torch.{name}) would cast too")
        else:
            msg += f"; cast when loading: from_pretrained(..., dtype=torch.{name}) or model.to(torch.{name})"
        out.append(Problem("dtype", paths[0], "parameter", dt.name, name, msg, tensors=paths))
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
    missing = [clipped(k) for k in expected if k not in found][:8]
    what, found = clipped(what, 200), [clipped(k) for k in found][:8]
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
        import json

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
    int8 = {b for k, e in by_key.items() if (b := base_of(k, "weight")) is not None and e.dtype is INT8}
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


def truncated_problem(root: str) -> Problem:
    msg = "the pickle is too deep or too large to walk completely; some tensors are not listed"
    return Problem("truncated", root, "container", "walk limit", "complete walk", msg)


def group_problems(group: Group, want: str | None, exp: Any = None) -> list[Problem]:
    """Everything wrong with one checkpoint; ``exp`` is its dtype expectation (see ``expect.py``) or None."""
    entries = [e for fs in group.files for e in fs.entries]
    owner = {e.key: fs for fs in group.files for e in fs.entries}
    by_key = {e.key: e for e in entries}
    out: list[Problem] = []
    for fs in group.files:
        out += _saved_device_problems(group, fs, want)
        if fs.unsafe or fs.failure:
            from torchdoctor._checkpoint.unsafe import unsafe_problems

            out += unsafe_problems(group.path_of, fs.label, fs.unsafe, fs.failure)
    out += _unsupported_problems(group, entries, want) + _dtype_problems(group, entries, exp)
    for check in _QUANT_CHECKS.values():
        out += check(group, by_key, lambda key: owner[key].small(key) if key in owner else None)
    return out
