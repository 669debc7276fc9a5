"""``move``: put every tensor of an object on one device / dtype, in place, verified, never half-moved.

``Module.to`` moves parameters and buffers only: it leaves plain tensor attributes, list-held modules,
bitsandbytes ``quant_state`` (before 0.45.3) and ``Linear8bitLt.state.CB/SCB`` behind, and
``Linear4bit.to("meta")`` fails after moving the shared quant_state in place. ``move`` takes its
tensors from the walker instead, keeps ``Parameter`` objects wherever ``Module.to`` would, moves shared storage
once, casts only what a cast is meant for, verifies the result with ``scan``, and undoes everything when a
tensor fails part-way.

Dtype policy: what a tensor is cast to is ``Policy.decide`` for ``dtype=`` (``torchdoctor._scan.casts.cast_target``),
so move makes exactly what scan then expects. Floating parameters, buffers and module attributes are cast;
integer/bool tensors, packed storage, quantization metadata, tensors hanging off other tensors and tensors of
plain objects (a scheduler's ``alphas_cumprod``, which ``pipe.to`` keeps fp32 too) are moved, never cast. With
``keep_fp32=True`` the ``_keep_in_fp32_modules`` of transformers (non-strict for fp16 only, strict for fp16 and
bf16, as ``from_pretrained`` applies them) and diffusers (any dtype) become fp32, and a peft adapter that is fp32
throughout stays fp32 (peft's own default, ``autocast_adapter_dtype=True``); an adapter that would otherwise be
mixed within itself is cast whole. ``keep_fp32=False`` casts exactly what ``Module.to`` casts.

Rollback (``torchdoctor._move.undo``): every change gets its undo record before it is made. ``"auto"`` keeps
weak references to the originals, so a tensor someone else still holds comes back as itself; tensors nobody holds are
rebuilt from the moved data (views of one storage from one conversion, so they still share it), and a narrowing
same-device cast (fp32 -> bf16) comes back rounded and is named as ``lost_precision``. What a copy cannot stand in
for (cross-device originals, storages shared by several units, tensors with autograd history or hooks) is kept
strongly. ``"exact"`` (or True) keeps every original until the end; ``False`` undoes nothing and lists what moved.
Rollback also follows a failed verification; an interrupt stays a ``KeyboardInterrupt`` with a note of the outcome.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from collections.abc import Iterable
from typing import Any, NamedTuple

import torch

from torchdoctor._move import owners as q
from torchdoctor._move.expect import Expect
from torchdoctor._scan.apps import recomputed
from torchdoctor._scan.casts import cast_target
from torchdoctor._scan.policy import Policy
from torchdoctor._report.model import PlacementError, Target
from torchdoctor._placement import PACKED_DTYPES, compact, device_str, dtype_str, parse_device, parse_dtype, same_device
from torchdoctor._report.htmlmap import HtmlMapMixin
from torchdoctor._report.records import FrozenRecord
from torchdoctor._report.text import format_error, human_bytes, schema, public_types
from torchdoctor._walk import Entry, walk

__all__ = ["Expect", "HeldBy", "MoveReport", "Moved", "PlanStep", "plan"]

_QUIET_VIA = frozenset({"param.data", "assign"})
_NONE: list[Entry] = []  # a step without aliases (shared, never written to)
_MUTABLE = (dict, list)


@dataclass(init=False, repr=False, eq=False)
class PlanStep(FrozenRecord):
    """One thing ``move`` would do: ``path``, ``role``, ``found`` and ``expected`` (compact forms), ``via``.

    ``via``: ``param.data`` (same Parameter object), ``new parameter`` (a new object of the same class, where
    ``Module.to`` replaces it too), ``assign``, ``own .to`` (wrapper subclasses), or ``refused: <why>``.
    """

    path: str
    role: str
    found: str
    expected: str
    via: str
    _fields = ("path", "role", "found", "expected", "via")

    def __init__(self, path: str, role: str, found: str, expected: str, via: str) -> None:
        d = self.__dict__
        d["path"], d["role"], d["found"], d["expected"], d["via"] = path, role, found, expected, via

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    @property
    def missed_by_module_to(self) -> bool:
        """``Module.to`` would leave this tensor as it is (a plain attribute, a list-held module's weight, a
        quant_state, optimizer state): the reason to use ``move``. Known for steps ``plan`` made; False otherwise."""
        return bool(self.__dict__.get("_missed", False))

    def __str__(self) -> str:
        how = "" if self.via in _QUIET_VIA else f", {self.via}"
        arrow = f" -> {self.expected}" if self.expected else ""
        return f"{self.path}  {self.found}{arrow}  ({self.role}{how})"


class Moved(NamedTuple):
    """One path ``move`` changed: compact forms before and after, and the bytes it holds now."""

    path: str
    src: str
    dst: str
    nbytes: int


class HeldBy(NamedTuple):
    """An optimizer holding parameters the move changed: ``name`` (its class), ``path`` (its state rows' prefix,
    ``optimizer`` or ``optimizer[i]``), ``params`` (how many of the moved tensors it holds), ``moved`` (its state
    tensors that followed them), ``found`` (True when ``move`` found it, False when passed as ``optimizer=``)."""

    name: str
    path: str
    params: int
    moved: int
    found: bool

    def __str__(self) -> str:
        how = "found by move" if self.found else "passed as optimizer="
        state = (f"its state was moved with them ({self.moved} tensor(s))" if self.moved else
                 "its state stays as it was (none yet, or kept apart on purpose)")
        return f"optimizer {self.name} holds {self.params} of these parameters ({how}); {state}"


@dataclass(init=False, repr=False, eq=False)
class MoveReport(HtmlMapMixin, FrozenRecord):  # the views' one-line repr, the record's equality
    """What ``move`` did: ``moved`` rows (path, from, to, nbytes), ``kept`` (path, why not cast), ``storage_bytes``,
    ``missed`` (the moved paths ``Module.to`` would have left as they were: the reason to use ``move``).
    ``device``/``dtype`` are torch objects here and strings in ``to_dict()``."""

    moved: tuple[Moved, ...]
    device: torch.device | None
    dtype: torch.dtype | None
    kept: tuple[tuple[str, str], ...] = ()
    storage_bytes: int = 0
    seconds: float = 0.0
    problems: tuple[Any, ...] = ()
    optimizers: tuple[HeldBy, ...] = ()
    notes: tuple[str, ...] = ()
    missed: tuple[str, ...] = ()
    _fields = ("moved", "device", "dtype", "kept", "storage_bytes", "seconds", "problems", "optimizers", "notes",
               "missed")

    def __init__(self, moved: Iterable[Moved], device: torch.device | str | None, dtype: torch.dtype | str | None,
                 kept: Iterable[tuple[str, str]] = (), storage_bytes: int = 0, seconds: float = 0.0,
                 problems: tuple[Any, ...] = (), optimizers: Iterable[HeldBy] = (), notes: Iterable[str] = (),
                 missed: Iterable[str] = ()) -> None:
        d = self.__dict__  # accepts the strings and lists ``move`` builds it from
        d["moved"], d["kept"] = tuple(moved), tuple(kept)
        d["device"] = parse_device(device) if isinstance(device, str) else device
        d["dtype"] = parse_dtype(dtype) if isinstance(dtype, str) else dtype
        d["storage_bytes"], d["seconds"], d["problems"] = storage_bytes, seconds, problems
        d["optimizers"], d["notes"], d["missed"] = tuple(optimizers), tuple(notes), tuple(missed)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def bytes(self) -> int:
        """Bytes the moved tensors hold now, each storage once (tied weights, shared views)."""
        return self.storage_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": schema("move"), "ok": self.ok, "device": device_str(self.device) if self.device else None,
            "dtype": dtype_str(self.dtype) if self.dtype else None, "storage_bytes": self.storage_bytes,
            "seconds": round(self.seconds, 6), "missed_by_module_to": list(self.missed),
            "moved": [{"path": m.path, "from": m.src, "to": m.dst, "nbytes": m.nbytes} for m in self.moved],
            "kept": [{"path": p, "reason": r} for p, r in self.kept],
            "optimizers": [o._asdict() for o in self.optimizers],
            "notes": list(self.notes),
        }

    def text(self, limit: int = 40) -> str:
        where = " ".join(x for x in (device_str(self.device) if self.device else "",
                                     dtype_str(self.dtype) if self.dtype else "") if x)
        from torchdoctor._report.folded import fold_moves

        lines = [f"moved {len(self.moved)} tensor(s), {human_bytes(self.bytes)}, to {where} in {self.seconds:.3f} s"]
        # what Module.to would have missed first, an optimizer's state in one line, then the rest by module
        lines += fold_moves(self.moved, self.missed, limit, [o.path for o in self.optimizers])
        reasons: dict[str, int] = {}
        for _, r in self.kept:
            reasons[r] = reasons.get(r, 0) + 1
        if reasons:
            lines.append("not cast, on purpose: " + "; ".join(f"{n} x {r}" for r, n in reasons.items()))
        lines.extend(str(o) for o in self.optimizers)
        lines.extend(self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()


public_types(MoveReport, PlanStep)


# --- planning: what moves where, and what is refused (read-only) ------------------------------------------------


# _Step and _Plan are plain classes, not dataclasses: creating a dataclass compiles its methods at import, about a
# millisecond each, and the first ``move`` of a process pays every import (issue 28).
class _Step:
    __slots__ = ("entry", "aliases", "device", "dtype", "via", "refused", "group", "sid", "owns")

    def __init__(self, entry: Entry, aliases: list[Entry], device: torch.device, dtype: torch.dtype, via: str,
                 refused: tuple[str, str, str] | None = None, group: Any = None) -> None:
        self.entry = entry
        self.aliases = aliases
        self.device = device
        self.dtype = dtype
        self.via = via
        self.refused = refused  # (kind, why, fix)
        self.group = group
        self.sid: int | None = None  # the storage's id where it has a real one (read once, here)
        self.owns = True  # the tensor covers its whole storage (``undo.owns_storage``), read with ``sid``

    def __repr__(self) -> str:
        return f"_Step({self.entry.path!r}, {self.device}, {self.dtype}, {self.via!r}, refused={self.refused!r})"

    def public(self) -> PlanStep:
        via = f"refused: {self.refused[1]}" if self.refused else self.via
        step = PlanStep(self.entry.path, self.entry.role, self.entry.info().compact,
                        compact(self.dtype, self.entry.info().shape, self.device), via)
        step.__dict__["_missed"] = not self.entry.moved_by_module_to  # not a field: equality and JSON unchanged
        return step


class _Plan:
    __slots__ = ("steps", "refusals", "kept", "expect")

    def __init__(self, steps: list[_Step], refusals: list[tuple[str, str, str, str, str]],
                 kept: list[tuple[str, str]], expect: Expect | None = None) -> None:
        self.steps = steps
        self.refusals = refusals  # (kind, path, found, why, fix)
        self.kept = kept
        self.expect = expect  # what a cast-only move's result must show (see ``Expect``), or None

    def public(self) -> list[PlanStep]:
        out = [PlanStep(path, kind, found, "", f"refused: {why}") for kind, path, found, why, _ in self.refusals
               if kind in ("hook", "truncated")]
        return out + [s.public() for s in self.steps]

    def units(self) -> list[list[_Step]]:
        """Steps in canonical order; views of one storage form one unit, moved once where its first member is."""
        groups: dict[Any, list[_Step]] = {}
        for s in self.steps:
            if s.group is not None:
                groups.setdefault(s.group, []).append(s)
        units, done = [], set()
        for s in self.steps:
            if s.group is None or len(groups[s.group]) == 1:
                units.append([s])
            elif s.group not in done:
                done.add(s.group)
                units.append(groups[s.group])
        return units

    def raise_refusals(self) -> None:
        if not self.refusals:
            return
        rows = [f"{path}  {found}  {why}" for _, path, found, why, _ in self.refusals]
        kinds = {r[0] for r in self.refusals}
        fixes = "\n".join(dict.fromkeys(r[4] for r in self.refusals if r[4]))
        if kinds == {"immutable"}:
            raise TypeError(format_error(
                f"move changes objects in place, and {len(rows)} tensor(s) sit in immutable tuples; nothing was "
                "moved", rows, fixes))
        heads = {"meta": "hold no data (meta)", "hook": "are managed by accelerate or diffusers hooks", "immutable":
                 "sit in immutable tuples", "quant": "are quantized weights move cannot carry as they are",
                 "truncated": "may be missed (the walk hit a bound)"}
        head = "; ".join(f"{sum(1 for r in self.refusals if r[0] == k)} {heads[k]}" for k in sorted(kinds))
        raise PlacementError(format_error(f"move refused, nothing was moved: {head}", rows, fixes), fix=fixes)


def build(obj: Any, device: torch.device | None, dtype: torch.dtype | None, keep_fp32: bool) -> _Plan:
    if isinstance(obj, Target):
        obj = obj.obj
    if isinstance(obj, torch.Tensor):
        raise TypeError("move changes objects in place, and a tensor cannot change its device in place: use "
                        "t = t.to(device, dtype), or put tensors in a dict or module and move that")
    if isinstance(obj, (str, bytes, os.PathLike)):
        raise TypeError(f"move works on objects in memory, not on files ({obj!r}): load the checkpoint first "
                        "(torchdoctor scan FILE says what it holds)")
    w = walk(obj)
    refusals = [("truncated", p.path, p.found, p.message, "") for p in w.problems]
    for mpath, _mod, hook in w.hooks:
        why = q.hook_refusal(hook, device)
        if why:
            grouped = why.startswith("GroupOffloadingHook")
            attr = "_diffusers_hook" if grouped else "_hf_hook"
            refusals.append(("hook", f"{mpath}.{attr}" if mpath else attr, type(hook).__name__, why,
                             q.GROUP_FIX if grouped else q.HOOK_FIX))
    aliases: dict[str, list[Entry]] = {}
    for e in w.entries:
        if e.alias_of is not None:
            aliases.setdefault(e.alias_of, []).append(e)
    # what each tensor is cast to is the policy's decision for dtype=, the same scan verifies the move with
    policy = Policy(w, None, dtype, False) if dtype is not None else None
    expect = Expect.of(w, policy, obj) if device is None and policy is not None else None
    seen = expect.rows if expect is not None else None
    steps, kept = [], []
    keys: dict[Any, list[_Step]] = {}
    for e in w.entries:
        if e.alias_of is not None:
            continue
        t = e.tensor
        if (e.slot == "inner" and q.is_wrapper(e.owner)) or e.role == "offloaded":
            continue  # moved by the wrapper's own .to; offloaded weights belong to their (refused) hook
        if e.owner is e.module and isinstance(e.key, str) and e.role == "attribute" and recomputed(e.module, e.key):
            continue  # remade from its parameters by the module's own pre-hook at every call (weight_norm)
        target_dt, reason = cast_target(policy, e, keep_fp32) if policy is not None else (t.dtype, None)
        if seen is not None:
            seen.append((e, target_dt))
            if t.dtype in PACKED_DTYPES:  # float8 storage: its decision depends on its dtype
                expect = seen = None
        if reason and target_dt != dtype:
            kept.append((e.path, reason))
        if device is None:  # a cast only: most tensors of a verification end here
            if t.dtype == target_dt:
                continue
            target_dev = t.device
        else:
            target_dev = device
            if t.dtype == target_dt and same_device(t.device, target_dev):
                continue
        wrapper = q.is_wrapper(t)
        # without device= nothing crosses between meta and data
        src_meta, dst_meta = (t.device.type == "meta", device.type == "meta") if device is not None else (False, False)
        if wrapper:
            via = "own .to"
        elif isinstance(t, torch.nn.Parameter):
            via = "param.data" if src_meta == dst_meta else "new parameter"
        else:
            via = "assign"
        s = _Step(e, aliases.get(e.path, _NONE) if aliases else _NONE, target_dev, target_dt, via)
        if src_meta and not dst_meta:
            s.refused = ("meta", "on meta: no data to move",
                         f"model.to_empty(device={device_str(target_dev)!r})  # allocate, then load the weights:\n"
                         "model.load_state_dict(state_dict)  # or load_state_dict(state_dict, assign=True)")
        elif via != "param.data" and any(x.slot == "item" and not isinstance(x.owner, _MUTABLE) for x in [e, *s.aliases]):
            where = e.path if not isinstance(e.owner, _MUTABLE) else next(x.path for x in s.aliases)
            s.refused = ("immutable", f"held in an immutable {type(e.owner).__name__} ({where})",
                         "keep such tensors in a list or dict, or rebuild the tuple yourself: "
                         "obj.x = tuple(t.to(device) for t in obj.x)")
        elif device is not None and not same_device(t.device, target_dev):
            bnb = q.refusal(e, target_dev)
            if bnb:
                s.refused = ("quant", bnb[0], bnb[1])
        if s.refused:
            refusals.append((s.refused[0], e.path, e.info().compact, s.refused[1], s.refused[2]))
        if not wrapper and q.real_storage(t):
            try:
                with torch._C.DisableTorchFunction():  # its own storage, never one a function mode builds for it
                    st = t.untyped_storage()
                s.sid = sid = st._cdata
                n = st.nbytes()
                if n:
                    keys.setdefault((t.device, sid), []).append(s)
                s.owns = t.storage_offset() == 0 and t.nbytes == n
            except Exception:  # sparse layouts and other forms without one storage
                pass
        steps.append(s)
    for key, members in keys.items():
        if len(members) > 1 and _groupable(members):
            for s in members:
                s.group = key
    if expect is not None:
        expect.aliases = aliases
    return _Plan(steps, refusals, kept, expect)


def _groupable(members: list[_Step]) -> bool:
    """Views of one storage move as one flat copy when they agree on where to go (and, if cast, on dtypes)."""
    first = members[0]
    src = q.data_of(first.entry.tensor)
    if any(not same_device(s.device, first.device) for s in members):
        return False
    if all(q.data_of(s.entry.tensor).dtype == s.dtype for s in members):
        return True  # device only: the bytes move once, every view keeps its own dtype
    return (all(q.data_of(s.entry.tensor).dtype == src.dtype and s.dtype == first.dtype for s in members)
            and src.untyped_storage().nbytes() % src.element_size() == 0)


def plan(obj: Any, *, device: str | torch.device | int | None = None, dtype: str | torch.dtype | None = None,
         keep_fp32: bool = True) -> list[PlanStep]:
    """What ``move(obj, device, dtype)`` would do, one step per tensor that would change; read-only.

    >>> m = torch.nn.Linear(2, 2)
    >>> print(plan(m, dtype="bf16")[0])
    weight  f32[2,2]@cpu -> bf16[2,2]@cpu  (parameter)
    """
    dev = parse_device(device) if device is not None else None
    dt = parse_dtype(dtype) if dtype is not None else None
    return build(obj, dev, dt, keep_fp32).public()




