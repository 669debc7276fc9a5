"""The strict rules: which devices and dtypes an aten op accepts together, as data.

``check(op, args, kwargs, profile)`` judges one op call before it runs, as ``guard(mode="strict")`` and
``simulate`` see it from a ``TorchDispatchMode``. The rules are directional: a norm accepts a bf16 input
with fp32 weight and bias but not the reverse; mm/linear/conv need equal dtypes; a CPU 0-dim scalar may join an
elementwise device op, not index_select/gather/embedding; x[idx] accepts CPU indices; copies cross devices. A meta
tensor meeting real data is always a problem: on CPU, linear/matmul/conv with a meta weight return uninitialised memory.

The table itself lives in ``_rules_table`` (registered on import); this module is the machinery. Rules are
registered per op family by ``@rule`` (which refuses duplicates); ``RULES.merged({...})`` gives a
copy with per-call overrides. Cost matters (a dispatch mode pays this on every aten op): one level over args and kwargs, a dict lookup
keyed by the ``OpOverload``, and a fast path that returns at once when every tensor shares device and dtype.

>>> import torch
>>> a, b = torch.ones(2, 2), torch.ones(2, 2, dtype=torch.bfloat16)
>>> check(torch.ops.aten.mm.default, (a, b), {}).kind
'dtype'
>>> check(torch.ops.aten.native_layer_norm.default, (b, [2], a[0], a[0], 1e-5), {}) is None
True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from sys import modules as _modules
from typing import TYPE_CHECKING, Any

import torch

from torchdoctor import _placement
from torchdoctor._report.model import Problem
from torchdoctor._report.records import FrozenRecord
from torchdoctor._rules.args import (_CASTS, _FLOAT8, LABELLER, Key, _arg_names, _Call, _gather, _inert,
                                     _plain_agree, _uniform, dispatch_slots)
from torchdoctor._placement import compact, device_str, dtype_str
from torchdoctor._rules.dtypeops import float8_message, judged_family, storage_only
from torchdoctor._rules.missing import MISSING, missing_problem
from torchdoctor._rules.args import OpArgs as OpArgs  # guard's fixer reads it here

if TYPE_CHECKING:  # pragma: no cover
    from torchdoctor._rules.profile import DeviceProfile

__all__ = ["RULES", "Finding", "Rule", "Rules", "check", "check_all", "describe_args", "find", "quiet", "rule",
           "tensor_device"]

_Tensor = torch.Tensor
_T, _P = torch.Tensor, torch.nn.Parameter


# one device vocabulary: every rule reads devices through torchdoctor._placement
tensor_device = _placement.tensor_device
_norm = _placement.norm_device


@dataclass(init=False, repr=False, eq=False)
class Finding(FrozenRecord):
    """A problem plus what a fixer needs: which arguments to move (``offenders``) and where (``target``).

    ``considered`` are the arguments that take part in the agreement; a fixer may pick another ``target``
    among their values (the model's majority) and move every considered argument that differs.
    """

    problem: Problem
    attr: str  # "device" | "dtype" | ""
    target: Any  # torch.device | torch.dtype | None
    offenders: tuple[Key, ...]
    considered: tuple[Key, ...] = ()
    fixed: bool = False  # ``target`` is the only fix (a loss's target follows its input's dtype, never the reverse)
    _fields = ("problem", "attr", "target", "offenders", "considered", "fixed")

    def __init__(self, problem: Problem, attr: str, target: Any, offenders: tuple[Key, ...],
                 considered: tuple[Key, ...] = (), fixed: bool = False) -> None:
        self.__dict__.update(problem=problem, attr=attr, target=target, offenders=offenders, considered=considered,
                             fixed=fixed)


@dataclass(init=False, repr=False, eq=False)
class Rule(FrozenRecord):
    """One op family: its device policy, its dtype check and the profile family for dtype support."""

    family: str
    ops: tuple[str, ...]
    device: str  # a key of DEVICE_POLICIES: "same" | "all" | "index" | "copy" | "free" ...
    dtype: Check | None
    support: str = "storage"  # DeviceProfile.supports family (matmul, conv, norm, sdpa, scaled_mm, storage)
    uniform_too: bool = False  # judge even when every tensor shares device and dtype (float embedding indices)
    _fields = ("family", "ops", "device", "dtype", "support", "uniform_too")

    def __init__(self, family: str, ops: tuple[str, ...], device: str, dtype: Check | None, support: str = "storage",
                 uniform_too: bool = False) -> None:
        self.__dict__.update(family=family, ops=ops, device=device, dtype=dtype, support=support, uniform_too=uniform_too)


Check = Callable[["_Call"], "list[Finding]"]


class Rules:
    """The registry: family name -> ``Rule``; op name (``aten::mm``) -> family. Lookups cached per OpOverload."""

    def __init__(self) -> None:
        self.families: dict[str, Rule] = {}
        self.by_name: dict[str, str] = {}
        self._by_op: dict[Any, Rule] = {}

    def add(self, r: Rule) -> None:
        if r.family in self.families:
            raise ValueError(f"rule family {r.family!r} is registered twice")
        for name in r.ops:
            if name in self.by_name:
                raise ValueError(f"op {name!r} already belongs to rule family {self.by_name[name]!r}")
        self.families[r.family] = r
        for name in r.ops:
            self.by_name[name] = r.family
        _FAST.clear()  # the per-op fast-path facts are read from the rules
        _SLOTS.clear()

    def merged(self, overrides: Mapping[str, str | Rule]) -> Rules:
        """A copy where each ``op name -> family name`` (or ``-> Rule``) override applies; the global table stays."""
        new = Rules()
        new.families = dict(self.families)
        new.by_name = dict(self.by_name)
        for name, target in overrides.items():
            name = _qualified(name)
            if isinstance(target, Rule):
                new.families[target.family] = target
                target = target.family
            if target not in new.families:
                raise ValueError(f"unknown rule family {target!r}; known: {', '.join(new.families)}")
            new.by_name[name] = target
        return new

    def for_op(self, op: Any) -> Rule:
        r = self._by_op.get(op)
        if r is None:
            r = self._by_op[op] = self._lookup(op)
        return r

    def _lookup(self, op: Any) -> Rule:
        schema = getattr(op, "_schema", None)
        name = schema.name if schema is not None else str(op)
        fam = self.by_name.get(name)
        if fam is None:
            base = name.split("::")[-1]
            if base.startswith(("_foreach_", "_fused_")):
                fam = "multi_tensor"
            elif "scaled_dot_product" in base or base in ("_flash_attention_forward", "_efficient_attention_forward"):
                fam = "attention"
            else:
                fam = "elementwise"
        return self.families[fam]


def _qualified(name: str) -> str:
    return name if "::" in name else f"aten::{name}"


RULES = Rules()
DEVICE_POLICIES: dict[str, Check] = {}  # "same" | "index" | "copy" | "free" -> device check (``_rules_table``)


def rule(family: str, ops: Sequence[str] = (), *, device: str = "same", support: str = "storage",
         uniform_too: bool = False) -> Callable[[Check | None], Check | None]:
    """Register the dtype check of an op family (``None`` for families with a device policy only)."""

    def register(fn: Check | None) -> Check | None:
        RULES.add(Rule(family, tuple(_qualified(o) for o in ops), device, fn, support, uniform_too))
        return fn

    return register


# --- calls ---------------------------------------------------------------------------------------------------


def label(op: Any, key: Key) -> str:
    """How messages name one argument of ``op``: ``arg 1 (mat2)``, ``arg 1 (indices[0])``, ``kwarg attn_mask``."""
    return _Call(op, (), {}, [], _arg_names(op)).label(key)


def _problem(c: _Call, kind: str, offenders: Sequence[Key], found: str, expected: str, message: str) -> Problem:
    return Problem(kind, c.label(offenders[0]) if offenders else str(c.op), "argument", found, expected,
                   f"{c.op}: {message}", op=str(c.op), tensors=tuple(describe_call(c)))


# --- profile limits ------------------------------------------------------------------------------------------

_SUPPORT_CACHE: dict[tuple[int, torch.dtype, str], tuple[Any, bool]] = {}


def _supports(profile: DeviceProfile, dtype: torch.dtype, family: str) -> bool:
    key = (id(profile), dtype, family)
    hit = _SUPPORT_CACHE.get(key)
    if hit is None or hit[0] is not profile:  # (a dtype it runs slowly is said once here: ``DeviceProfile.runs``)
        hit = _SUPPORT_CACHE[key] = (profile, profile.runs(dtype, family))
    return hit[1]


def _profile_findings(c: _Call, r: Rule, profile: DeviceProfile) -> list[Finding]:
    out: list[Finding] = []
    seen: set[torch.dtype] = set()
    for k, t in c.tensors:
        dt = t.dtype
        if dt in seen or not (dt.is_floating_point or dt.is_complex):
            continue
        fam = judged_family(c.op, r.support, profile, dt)
        if tensor_device(t).type != profile.type or _supports(profile, dt, fam):
            continue
        seen.add(dt)
        if fam != r.support and dt in _FLOAT8 and any(x.is_floating_point() and x.dtype not in _FLOAT8
                                                      for _, x in c.tensors):
            continue  # float8 met by another dtype: torch refuses the promotion before any kernel (``_float8_mixed``)
        out.append(_unsupported(c, k, dt, fam, profile))
    want_dt, want_dev = c.kwargs.get("dtype"), c.kwargs.get("device")
    if isinstance(want_dt, torch.dtype) and want_dt not in seen and want_dev is not None:
        fam = judged_family(c.op, "storage", profile, want_dt)
        if torch.device(want_dev).type == profile.type and not _supports(profile, want_dt, fam):
            out.append(_unsupported(c, ("dtype", -1), want_dt, fam, profile))
    return out


def _unsupported(c: _Call, k: Key, dt: torch.dtype, family: str, profile: DeviceProfile) -> Finding:
    where = f"{profile.type} (capability {profile.capability[0]}.{profile.capability[1]})" if profile.type == "cuda" \
        else profile.type
    what = f"hold {dtype_str(dt)} tensors" if family == "storage" else f"compute in {dtype_str(dt)} (it has no " \
        f"{dtype_str(dt)} kernels)" if family == "compute" else f"run {family} in {dtype_str(dt)}"
    msg = f"{c.label(k)}: {where} cannot {what}" if not storage_only(profile, c.op, dt) else \
        f"{c.label(k)}: {float8_message(profile.type, c.op, dt)}"
    return Finding(_problem(c, "unsupported_dtype", [k], dtype_str(dt), f"a dtype {profile.type} supports", msg),
                   "", None, (k,))


# --- entry points --------------------------------------------------------------------------------------------


_NO_KWARGS: Mapping[str, Any] = {}
# float8 storage never takes part in type promotion ("Promotion for Float8 Types is not supported"): an op that
# mixes it with another floating dtype fails on every device, whatever its family's rule says
def find(op: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None,
         profile: DeviceProfile | None = None, rules: Rules | None = None) -> list[Finding]:
    """Every finding of one op call, device/meta problems first (the machinery behind ``check``); first of all,
    an op the profile's backend has no kernel for (``_rules.missing``: ``_int_mm`` on MPS)."""
    if profile is not None and profile.type in MISSING and (lack := missing_problem(op, args, kwargs, profile)):
        return [Finding(lack, "", None, ()), *_find(op, args, kwargs, profile, rules)]
    return _find(op, args, kwargs, profile, rules)


def _find(op: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None, profile: DeviceProfile | None,
          rules: Rules | None) -> list[Finding]:
    if kwargs is None:
        kwargs = _NO_KWARGS
    if profile is None and rules is None:  # fastest path (per aten op): plain tensors on one device, nothing to judge
        fast = _FAST.get(op)
        if fast is None:
            r = RULES._by_op.get(op) or RULES.for_op(op)
            fast = _FAST[op] = (not r.uniform_too, r.dtype is None)
        if fast[0] and _plain_agree(args, fast[1]) and (not kwargs or _inert(kwargs)):
            return []
    table = rules or RULES
    r = table._by_op.get(op) or table.for_op(op)
    state: list[Any] = [None, None, False]  # fast path (runs per aten op): one device and no dtype rule to judge
    if _uniform(args, state) and (not kwargs or _uniform(kwargs.values(), state)) and not r.uniform_too:
        if state[0] is not None and state[0].type == "meta" and "device" in kwargs:
            pass  # a copy out of meta: let the copy rule look
        elif state[2] and (r.dtype is not None or profile is not None or any(
                isinstance(a, _Tensor) and a.dtype in _FLOAT8 for a in args)):
            pass  # dtypes differ: the family's dtype rule, the profile's limits or the float8 check must look
        elif profile is None:
            return []
        elif state[1] is None:
            if "dtype" not in kwargs or "device" not in kwargs:
                return []
        elif state[0].type != profile.type or _supports(profile, state[1],
                                                        judged_family(op, r.support, profile, state[1])):
            return []
    c = _Call(op, args, kwargs, _gather(args, kwargs), _arg_names(op))
    out = DEVICE_POLICIES[r.device](c)
    if r.dtype is not None:
        out.extend(r.dtype(c))
    elif _FLOAT8:
        out.extend(_float8_mixed(c))
    if profile is not None:
        out.extend(_profile_findings(c, r, profile))
    return out


_FAST: dict[Any, tuple[bool, bool]] = {}  # op -> (may take the fastest path, any dtype mix allowed)
_SLOTS: dict[int, tuple[Any, ...]] = {}  # id(op) -> (op, how to look, positions, lists, any dtype, kwargs to look at)


def quiet(op: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """True when ``find(op, args, kwargs)`` (global rules, no profile) surely finds nothing, for a call as a
    dispatch mode receives it (keyword-only arguments in ``kwargs``, the rest in ``args``): the op's schema says
    where tensors can be, so shape lists and scalars are skipped and a one-tensor op is quiet at once. False
    means "ask ``find``", never "a problem". Runs per aten op: keyed by id (an OpOverload hashes in Python)."""
    f = _SLOTS.get(id(op))
    if f is None or f[0] is not op:
        f = _SLOTS[id(op)] = (op, *_slots_of(op))
    _, how, pos, lists, any_dtype, kw = f
    if how == 0:
        return False
    if kw and kwargs and not _inert(kwargs):
        return False
    if how == 1:  # at most one tensor: nothing to disagree with
        return True
    if how == 2:  # every positional argument may be a tensor
        seq = args
    else:
        n = len(args)
        seq = [args[i] for i in pos if i < n]
        for i in lists:
            if i < n and args[i] is not None:
                seq.extend(args[i])
    labels = LABELLER in _modules
    dev = dt = None
    for a in seq:
        tp = type(a)
        if tp is _T or tp is _P:
            if labels and "_td_device" in a.__dict__:  # relabelled by a simulation: the rules read the label
                return False
            if dev is None:
                dev, dt = a.device, a.dtype
            elif a.device != dev or (a.dtype is not dt and (not any_dtype or a.dtype in _FLOAT8 or dt in _FLOAT8)):
                return False
        elif isinstance(a, _Tensor):  # subclasses, virtual tensors: the rules decide
            return False
    return True


def _slots_of(op: Any) -> tuple[int, tuple[int, ...], tuple[int, ...], bool, bool]:
    r = RULES._by_op.get(op) or RULES.for_op(op)
    slots = None if r.uniform_too else dispatch_slots(op)
    if slots is None:
        return 0, (), (), False, False
    pos, lists, whole, kw = slots
    how = 1 if not pos and not lists else 2 if whole else 3
    return how, pos, lists, r.dtype is None, kw


def _float8_mixed(c: _Call) -> list[Finding]:
    """A float8 tensor meeting another floating dtype in an op that promotes: it is the operand to cast."""
    floats = [(k, t) for k, t in c.tensors if t.is_floating_point()]
    f8 = [(k, t) for k, t in floats if t.dtype in _FLOAT8]
    rest = [t.dtype for _, t in floats if t.dtype not in _FLOAT8]
    if not f8 or not rest or getattr(getattr(c.op, "_schema", None), "name", "") in _CASTS:
        return []
    want = rest[0]
    bad = [k for k, _ in f8]
    found = dtype_str(f8[0][1].dtype)
    msg = (f"{c.label(bad[0])} is {found}, which takes part in no type promotion (torch refuses: Promotion for Float8 "
           f"Types is not supported); cast it to {dtype_str(want)} before the op")
    return [Finding(_problem(c, "dtype", bad, found, dtype_str(want), msg), "dtype", want, tuple(bad),
                    tuple(k for k, _ in floats))]


def check(op: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None,
          profile: DeviceProfile | None = None, rules: Rules | None = None) -> Problem | None:
    """The first problem of one op call, or None. ``op`` is an aten ``OpOverload``; ``args``/``kwargs`` as a
    ``TorchDispatchMode`` receives them. ``Problem.path`` names the argument (``arg 1 (mat2)``); callers that
    know parameter paths fill in ``module_path`` and replace it.

    >>> import torch
    >>> x = torch.ones(2, 2)
    >>> p = check(torch.ops.aten.mm.default, (x, x.to("meta")), {})
    >>> p.kind, p.path, p.found, p.expected
    ('meta', 'arg 1 (mat2)', 'meta', 'cpu')
    >>> check(torch.ops.aten.add.Tensor, (x, torch.tensor(2.0, dtype=torch.float64)), {}) is None
    True
    """
    found = find(op, args, kwargs, profile, rules)
    return found[0].problem if found else None


def check_all(op: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None,
              profile: DeviceProfile | None = None, rules: Rules | None = None) -> list[Problem]:
    """Every problem of one op call (``check`` returns the first)."""
    return [f.problem for f in find(op, args, kwargs, profile, rules)]


def _compact(t: torch.Tensor) -> str:
    try:
        return compact(t.dtype, tuple(int(s) for s in t.shape), tensor_device(t))
    except Exception:  # symbolic shapes, odd subclasses: never break a diagnostic
        return f"{dtype_str(t.dtype)}[?]@{device_str(tensor_device(t))}"


def describe_call(c: _Call) -> list[str]:
    return [f"{c.label(k)}: {_compact(t)}" for k, t in c.tensors]


def describe_args(op: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None) -> list[str]:
    """``['arg 0 (self): f32[2,2]@cpu', 'arg 1 (mat2): bf16[2,2]@cpu']``, one line per tensor argument.

    >>> import torch
    >>> describe_args(torch.ops.aten.mm.default, (torch.ones(2, 3), torch.ones(3, 1, dtype=torch.bfloat16)))
    ['arg 0 (self): f32[2,3]@cpu', 'arg 1 (mat2): bf16[3,1]@cpu']
    """
    kwargs = kwargs or {}
    return describe_call(_Call(op, args, kwargs, _gather(args, kwargs), _arg_names(op)))

