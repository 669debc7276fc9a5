"""The one result model every verb speaks: tensors, problems, errors, targets and the scan report.

Results are frozen dataclasses with fields; rendering is separate (``torchdoctor._report.text``) and every
device or dtype in them is printed by ``torchdoctor._placement``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from torchdoctor._placement import compact, device_str, dtype_str
from torchdoctor._report.records import FrozenRecord, record_repr
from torchdoctor._report.htmlmap import HtmlMapMixin
from torchdoctor._report.text import EXIT_USAGE, exit_code, human_bytes, render_problems, schema
from torchdoctor._report.text import public_types

_META = torch.device("meta")

_MISSING: Any = object()  # an argument not passed (a default_factory field gets a new dict)


ROLES = ("parameter", "buffer", "attribute", "quant_state", "subclass_inner", "container", "offloaded")
KINDS = ("device", "dtype", "meta", "saved_device", "quant_incomplete", "unsafe_global", "unsupported_dtype",
         "missing_kernel", "unsupported_op", "truncated", "unsupported", "lost_precision", "not_restored", "memory")


# The public result types are frozen records (torchdoctor._report.records): dataclasses (``fields`` / ``replace``
# are API) whose methods are written once instead of compiled per class at import.
@dataclass(init=False, repr=False, eq=False)
class TensorInfo(FrozenRecord):
    """One tensor reachable from an object, at one path."""

    path: str
    role: str
    device: torch.device
    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int
    moved_by_module_to: bool
    alias_of: str | None = None
    _fields = ("path", "role", "device", "dtype", "shape", "nbytes", "moved_by_module_to", "alias_of")

    def __init__(self, path: str, role: str, device: torch.device, dtype: torch.dtype, shape: tuple[int, ...],
                 nbytes: int, moved_by_module_to: bool, alias_of: str | None = None) -> None:
        # Item stores into the instance dict instead of eight frozen __setattr__ calls (or replacing __dict__, which
        # costs half again as much on CPython 3.11): scan builds one row per tensor path.
        d = self.__dict__
        d["path"] = path
        d["role"] = role
        d["device"] = device
        d["dtype"] = dtype
        d["shape"] = shape
        d["nbytes"] = nbytes
        d["moved_by_module_to"] = moved_by_module_to
        d["alias_of"] = alias_of

    @property
    def compact(self) -> str:
        return compact(self.dtype, self.shape, self.device)

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


@dataclass(init=False, repr=False, eq=False)
class Problem(FrozenRecord):
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
    _fields = ("kind", "path", "role", "found", "expected", "message", "op", "module_path", "module_type", "tensors")

    def __init__(self, kind: str, path: str, role: str, found: str, expected: str, message: str, op: str | None = None,
                 module_path: str | None = None, module_type: str | None = None, tensors: tuple[str, ...] = ()) -> None:
        # see TensorInfo.__init__: a model built on meta gives one Problem per tensor
        d = self.__dict__
        d["kind"] = kind
        d["path"] = path
        d["role"] = role
        d["found"] = found
        d["expected"] = expected
        d["message"] = message
        d["op"] = op
        d["module_path"] = module_path
        d["module_type"] = module_type
        d["tensors"] = tensors

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tensors"] = list(self.tensors)
        return d

    def __str__(self) -> str:
        return f"{self.kind:<8} {self.path}: {self.message}"



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


public_types(PlacementError, PlacementWarning)


@dataclass(init=False, repr=False, eq=False)
class Target:
    """What a CLI target or a test hands to the verbs: the object and, optionally, call arguments."""

    obj: Any
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __init__(self, obj: Any, args: tuple[Any, ...] = (), kwargs: Any = _MISSING) -> None:
        self.obj = obj
        self.args = args
        self.kwargs = {} if kwargs is _MISSING else kwargs

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return (self.obj, self.args, self.kwargs) == (other.obj, other.args, other.kwargs)  # type: ignore[attr-defined]
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable and compared by value, as the generated class was

    def __repr__(self) -> str:
        return record_repr(self, self.__dataclass_fields__)


public_types(Target)


@dataclass(init=False, repr=False, eq=False)
class ScanReport(HtmlMapMixin, FrozenRecord):  # the views' one-line repr, the record's equality
    """What ``scan`` found: ``.ok``, ``.problems``, ``.tensors`` (one row per path), ``.summary``, ``.to_dict()``,
    ``.to_html()`` (the device map; shown by notebooks through ``_repr_html_``).

    Frozen: ``dataclasses.replace(report, source=...)`` gives a relabelled copy. The JSON document's keys are
    the field names (``verb`` is the ``schema``; ``extra`` holds the keys of a checkpoint scan: ``files``,
    ``layout``, ``groups``, ``metadata``, merged at the top level) plus ``schema``, ``ok``, ``nothing_to_check``
    (no tensor was there: the command line's exit 2) and ``relocations`` (components not yet on the device asked
    for, with the move that fixes each: :meth:`relocations`).
    """

    tensors: tuple[TensorInfo, ...]
    problems: tuple[Problem, ...]
    expected: dict[str, dict[str, str]] = field(default_factory=dict)
    source: str | None = None
    truncated: bool = False
    summary: tuple[dict[str, Any], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    verb: str = "scan"
    _fields = ("tensors", "problems", "expected", "source", "truncated", "summary", "extra", "verb")

    def __init__(self, tensors: tuple[TensorInfo, ...], problems: tuple[Problem, ...], expected: Any = _MISSING,
                 source: str | None = None, truncated: bool = False, summary: tuple[dict[str, Any], ...] = (),
                 extra: Any = _MISSING, verb: str = "scan") -> None:
        d = self.__dict__  # frozen: stored as the generated __init__ did, past __setattr__
        d["tensors"] = tensors
        d["problems"] = problems
        d["expected"] = {} if expected is _MISSING else expected
        d["source"] = source
        d["truncated"] = truncated
        d["summary"] = summary
        d["extra"] = {} if extra is _MISSING else extra
        d["verb"] = verb

    @classmethod
    def of_rows(cls, rows: Sequence[tuple[Any, ...]], problems: tuple[Problem, ...], expected: dict[str, Any],
                source: str | None, truncated: bool, summary: tuple[dict[str, Any], ...]) -> ScanReport:
        """A report whose ``tensors`` are made from ``rows`` (tuples in ``TensorInfo``'s field order; a shape may
        be a ``torch.Size``) when first read, once: most scans are asked for their problems only, and one object
        per tensor path was a fifth of a scan (issue 28). Equality, repr, pickling, ``fields``/``replace`` read
        it as if it had been made eagerly."""
        report = cls.__new__(cls)
        report.__dict__.update(_rows=rows, problems=problems, expected=expected, source=source, truncated=truncated,
                               summary=summary, extra={}, verb="scan")
        return report

    def __getattr__(self, name: str) -> Any:  # only a lookup that found nothing comes here
        if name == "tensors":
            rows = self.__dict__.get("_rows")
            if rows is not None:
                info = TensorInfo
                tensors = tuple([info(r[0], r[1], r[2], r[3], tuple(r[4]), r[5], r[6], r[7]) for r in rows])
                d = {"tensors": tensors}  # in field order, as __init__ stores them (pickles and vars() unchanged)
                d.update((k, v) for k, v in self.__dict__.items() if k != "_rows")
                object.__setattr__(self, "__dict__", d)
                return tensors
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _values(self) -> tuple[Any, ...]:
        if "_rows" in self.__dict__:
            self.tensors
        return super()._values()

    def __getstate__(self) -> dict[str, Any]:
        if "_rows" in self.__dict__:
            self.tensors
        return self.__dict__

    @property
    def ok(self) -> bool:
        return not self.problems

    def __bool__(self) -> bool:  # ``if report:`` reads as "is it fine"
        return self.ok

    @property
    def nothing_to_check(self) -> bool:
        """No tensor was found and nothing was wrong (``scan(42)``, an empty dict, a ``ReLU``): ``ok`` holds, yet
        nothing was checked, as ``torchdoctor scan`` says with exit 2."""
        return not self.problems and not (self.__dict__.get("_rows") or self.tensors)

    def exit_code(self) -> int:
        """The command line's exit code for this report: 0 ok, 1 problems, 2 something could not be checked or
        nothing was there to check."""
        return EXIT_USAGE if self.nothing_to_check else exit_code(self.problems)

    def to_dict(self) -> dict[str, Any]:
        from torchdoctor._report.order import with_whence  # read when rendered: a move or a first scan never needs it

        doc: dict[str, Any] = {
            "schema": schema(self.verb),
            "ok": self.ok,
            "nothing_to_check": self.nothing_to_check,
            "source": self.source,
            "truncated": self.truncated,
            "expected": with_whence(self.expected),  # each row says where its expectation came from
            "problems": [p.to_dict() for p in self.problems],
            "relocations": [m.to_dict(bool(self.extra.get("keyed"))) for m in self.relocations()[1]],
            "summary": list(self.summary),
            "tensors": [t.to_dict() for t in self.tensors],
        }
        doc.update(self.extra)
        return doc

    def relocations(self) -> tuple[list[Problem], list[Any]]:
        """(the problems to act on, the components not yet on the device asked for: ``Relocation`` objects, one
        move each)."""
        from torchdoctor._report.order import split_relocations

        return split_relocations(self.problems, self.expected, self.tensors)

    def text(self, limit: int = 40) -> str:
        return render_report(self, limit=limit)

    def __str__(self) -> str:
        return self.text()


def summarize(rows: Iterable[tuple[TensorInfo, torch.Tensor | None]]) -> tuple[dict[str, Any], ...]:
    """Group by (device, dtype), counting each storage once (tied weights, views, aliases)."""
    infos, tensors = [], []
    for info, tensor in rows:
        infos.append((info.path, info.role, info.device, info.dtype, info.shape, info.nbytes, info.moved_by_module_to,
                      info.alias_of))
        tensors.append(tensor)
    return summarize_rows(infos, tensors)


def summarize_rows(rows: Sequence[tuple[Any, ...]], tensors: Sequence[torch.Tensor | None]) -> tuple[dict[str, Any], ...]:
    """``summarize`` over rows in ``TensorInfo``'s field order, ``tensors[i]`` the tensor of row i (None: no
    storage to read)."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}  # -> [tensors, nbytes]
    seen: set[Any] = set()
    for info, tensor in zip(rows, tensors):
        if info[7] is not None:  # an alias
            continue
        dev = info[2]
        if tensor is not None and dev != _META:  # not ``.type``: it builds a new string per call
            try:
                st = tensor.untyped_storage()
                key: Any = (dev, st.data_ptr(), st.nbytes())
            except Exception:
                key = None
            if key is not None:
                if key in seen:
                    continue
                seen.add(key)
        g = groups.get((dev, info[3]))
        if g is None:
            g = groups[(dev, info[3])] = [0, 0]
        g[0] += 1
        g[1] += info[5]
    return summary_of(groups)


def summary_of(groups: dict[tuple[torch.device, torch.dtype], list[int]]) -> tuple[dict[str, Any], ...]:
    """The summary rows of ``(device, dtype) -> [tensors, nbytes]`` groups, largest first."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for (dev, dt), (n, nbytes) in groups.items():
        key = (device_str(dev), dtype_str(dt))  # cuda and cuda:0 are one group
        m = merged.setdefault(key, {"device": key[0], "dtype": key[1], "tensors": 0, "nbytes": 0})
        m["tensors"] += n
        m["nbytes"] += nbytes
    return tuple(sorted(merged.values(), key=lambda g: -g["nbytes"]))




def render_report(report: ScanReport, limit: int = 40) -> str:
    """Problems first, by path, then the compact summary."""
    from torchdoctor._report.order import held_as, render_relocations, with_whence

    keyed = bool(report.extra.get("keyed"))  # a dict of components: the fix reads obj['model'].to(...)
    lines: list[str] = []
    head = report.source or "object"
    n_alias = sum(1 for t in report.tensors if t.alias_of)
    real, moves = report.relocations()
    if real:
        moved = sum(len(m.members) for m in moves)
        rest = f"; first the {len(real)} to fix, then {moved} not yet on the device asked for" if moves else ""
        lines.append(f"{len(report.problems)} problem(s) in {head}{rest}:")
        lines.extend(render_problems(real, limit, urgent_first=True))
        lines.extend(render_relocations(moves, held_as(keyed), keyed))
    elif moves:
        lines.append(f"{len(report.problems)} problem(s) in {head}, every one a tensor not yet on the device "
                     "asked for:")
        lines.extend(render_relocations(moves, held_as(keyed), keyed))
    elif report.nothing_to_check:  # the command line's words: exit 2 there, exit_code() 2 here
        lines.append(f"nothing to check: {head} holds no tensors; point scan at a model, a pipeline or a checkpoint")
    else:
        lines.append(f"ok: no placement problems in {head}")
    for n in report.extra.get("notes") or ():  # notes leave ``ok`` alone (a rounded rotary buffer): said, not counted
        lines.append(f"note: {n.get('path')}: {n.get('message')}" if isinstance(n, dict) else f"note: {n}")
    if report.expected:
        exp = ", ".join(
            f"{name or '<root>'}: {e.get('device', '?')} {e.get('dtype', '?')}" for name, e in list(report.expected.items())[:8]
        )
        more = f" (+{len(report.expected) - 8} more)" if len(report.expected) > 8 else ""
        whence = list(dict.fromkeys(f"{k} from {e[k + '_source']}" for e in with_whence(report.expected).values()
                                    for k in ("device", "dtype") if e.get(k + "_source")))
        lines.append(f"expected: {exp}{more}" + (f" ({'; '.join(whence)})" if whence else ""))
    lines.append(f"{len(report.tensors)} tensor paths ({n_alias} aliases); by device and dtype, each storage once:")
    for g in report.summary[:limit]:
        lines.append(f"  {g['device']:<8} {g['dtype']:<14} {g['tensors']:>7} tensors  {human_bytes(g['nbytes']):>11}")
    if len(report.summary) > limit:
        lines.append(f"  ... and {len(report.summary) - limit} more groups")
    return "\n".join(lines)

public_types(TensorInfo, Problem, ScanReport)
