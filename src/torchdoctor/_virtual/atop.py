"""Fixes of a block of the program's own code (``virtual_devices``, ``torchdoctor run``, ``@pytest.mark.simulate``)
proven at the failing op. A block runs once, so its fix cannot be re-run on a fresh copy as ``simulate``'s is;
instead, when a problem is recorded, the op's operands are kept as metadata-only twins (shape, stride and dtype on
meta, the virtual device as a label, and what names them: path, maker, cast line, the caller's argument). After the
run each fix is applied to those twins (each tensor it names moved or cast as its code says), and the op runs again
on them: the rules must find nothing, its meta kernel must take them, and a silent promotion must be gone. When the
op's output is then the one the rest of the run went on with (it continued as if fixed), the ops it fed ran on it
with no problem of their own: that is said too.

A fix that acts on program state the twins cannot show (an optimizer rebuilt, a weight loaded) is never applied:
it stays unproven, saying so. Nothing the program holds is touched: the twins are new meta tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from torchdoctor._placement import dtype_str
from torchdoctor._virtual.libout import OUTPUT, own_frame
from torchdoctor._virtual.linenames import line_names
from torchdoctor._virtual.origin import short_at, user_frame
from torchdoctor._virtual.twins import Operand, tags_of

__all__ = ["Case", "Cases", "Operand", "prove_at_ops", "tags_of", "twins"]

if TYPE_CHECKING:  # pragma: no cover  # a clean run keeps operand twins only: the proof loads with a fix
    from torchdoctor._virtual.prove import Fix

CASES = 64  # failing ops kept per run (the first ones; each problem's first meeting is among them)
_PER_OP = 2  # cases kept per op and set of culprits


class Case:
    """One failing op: its operands as they were (``before``) and as the run went on with them (``after``)."""

    __slots__ = ("func", "op", "at", "before", "after", "want", "line", "own", "names")

    def __init__(self, func: Any, before: tuple[list[Any], dict[str, Any]], after: tuple[list[Any], dict[str, Any]],
                 want: torch.dtype | None, tags: Any = None) -> None:
        self.func, self.op, self.before, self.after, self.want = func, str(func), before, after, want
        f = user_frame(2)
        self.at = short_at(f) if f is not None else None
        self.line = (f.f_code.co_filename, f.f_lineno) if f is not None else None  # the file and line of ``at``
        self.own = own_frame(2)  # the program's own line (a library layer failed: the line that called into it)
        # the tensors the program's own line reads by name, with their devices and makers (``meetsite``)
        self.names = line_names(2, tags) if tags is not None else ()

    def where(self) -> str:
        return f"{self.op} at {self.at}" if self.at else self.op


def twins(args: Sequence[Any], kwargs: dict[str, Any], tags: Any) -> tuple[list[Any], dict[str, Any]]:
    """The op's arguments with each tensor (also in a list or tuple) replaced by its ``Operand``."""
    def one(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            try:
                return Operand(v, *tags(v))
            except Exception:  # an odd tensor: kept out of the proof, never a break of the run
                return None
        if type(v) in (list, tuple) and any(isinstance(x, torch.Tensor) for x in v):
            return type(v)(one(x) for x in v)
        return v

    return [one(a) for a in args], {k: one(v) for k, v in kwargs.items()}


class Cases:
    """The failing ops of a run, kept as twins (bounded: ``CASES`` in all, ``_PER_OP`` per op and culprits)."""

    def __init__(self) -> None:
        self.cases: list[Case] = []
        self._count: dict[tuple[str, ...], int] = {}

    def keep(self, func: Any, before: tuple[Sequence[Any], dict[str, Any]], after: tuple[Sequence[Any], dict[str, Any]],
             tags: Any, want: torch.dtype | None = None) -> None:
        """Keep the failing op ``func`` on twins of its operands ``before`` (as they came) and ``after`` (as the run
        went on with them); ``tags(t)`` names an operand. Free once full, or for an op met again on the same
        named tensors (a layer repeated 80 times)."""
        if len(self.cases) >= CASES:
            return
        key = (str(func), *(_name(a) for a in before[0] if isinstance(a, torch.Tensor)))
        n = self._count.get(key, 0)
        if n < _PER_OP:
            self._count[key] = n + 1
            self.cases.append(Case(func, twins(*before, tags), twins(*after, tags), want, tags))


def _name(t: Any) -> str:
    """An operand's path, else the record of what made it (one factory is one source, wherever it runs)."""
    path = getattr(t, "_td_path", None)
    if path is not None:
        return str(path)
    origin = getattr(t, "_td_origin", None)
    if origin is None:
        return ""
    src = origin.source
    return f"{src.op} {src.paths[:1]} {src.at} {id(src.module)}"


def _operands(call: tuple[list[Any], dict[str, Any]]) -> list[Operand]:
    out: list[Operand] = []
    for v in (*call[0], *call[1].values()):
        if isinstance(v, Operand):
            out.append(v)
        elif type(v) in (list, tuple):
            out.extend(x for x in v if isinstance(x, Operand))
    return out


def _applied(call: tuple[list[Any], dict[str, Any]], fixes: Sequence[Fix]) -> tuple[list[Any], dict[str, Any], set[int]]:
    """The call with every fix applied to its twins; the indexes of the fixes that changed an operand."""
    from torchdoctor._virtual.entrycheck import targets

    used: set[int] = set()

    def one(v: Any) -> Any:
        if isinstance(v, Operand):
            device, dtype = None, None
            for i, f in enumerate(fixes):
                for t in targets(v, f):
                    if isinstance(t, torch.device):
                        device = t
                    elif isinstance(t, torch.dtype):
                        dtype = t
                    else:
                        continue
                    used.add(i)
            return v.tensor(device, dtype)
        if type(v) in (list, tuple):
            return type(v)(one(x) for x in v)
        return v

    return [one(a) for a in call[0]], {k: one(v) for k, v in call[1].items()}, used


def _far(fix: Fix, cases: Sequence[Case]) -> str | None:
    """The caller's argument or factory ``fix`` changes that a failing op met only through other ops, or None."""
    names = {n for n, t in fix.sets if isinstance(t, (torch.dtype, tuple))}
    for c in cases:
        for o in _operands(c.before):
            hit = next((n for n in o.far if n in names), None)
            if hit is not None:
                return hit
    return None


def _run(func: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    with torch._C.DisableTorchFunction(), torch.no_grad():
        return func(*args, **kwargs)


def _check(case: Case, fixes: Sequence[Fix], rules: Any, profile: Any) -> tuple[set[int], str | None, bool]:
    """(fixes that touched the op, what is still wrong or None, whether the output is the one the run went on
    with)."""
    args, kwargs, used = _applied(case.before, fixes)
    if not used:
        return used, None, False
    found = rules.find(case.func, args, kwargs, profile)
    if found:
        return used, found[0].problem.message, False
    if (raw := _stored_operand(case.func, args, kwargs)) is not None:  # meta kernels never refuse it; real ones do
        from torchdoctor._virtual.prove import STORED

        return used, f"it still computes with {raw} {STORED}", False
    try:
        out = _run(case.func, args, kwargs)
    except NotImplementedError:  # no meta kernel, or its output depends on values (nonzero): the rules judged it
        return used, None, False
    except Exception as exc:  # the kernel refuses the fixed operands: the answer, never a crash of the report
        if "data-dependent" in str(exc) or "meta" in str(exc).lower():
            return used, None, False
        return used, f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}", False
    first = out[0] if isinstance(out, (tuple, list)) and out else out
    if case.want is not None and isinstance(first, torch.Tensor) and first.dtype != case.want:
        return used, f"its output is still {dtype_str(first.dtype)}, not {dtype_str(case.want)}", False
    try:
        went = _run(case.func, *_applied(case.after, ())[:2])
        w = went[0] if isinstance(went, (tuple, list)) and went else went
        same = isinstance(first, torch.Tensor) and isinstance(w, torch.Tensor) and \
            (first.dtype, tuple(first.shape)) == (w.dtype, tuple(w.shape))
    except Exception:  # what the run went on with is not known: the op itself is still proven
        same = False
    return used, None, same


# ops whose kernels refuse integer or float8 storage beside floating operands ("self and mat2 must have the same
# dtype, but got Float and Byte"): their meta kernels do not check, so the proof does
_COMPUTE = frozenset(f"aten.{n}" for n in ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "mv", "addmv",
                                          "dot", "convolution", "_convolution", "conv2d", "conv1d", "conv3d"))


def _stored_operand(func: Any, args: list[Any], kwargs: dict[str, Any]) -> str | None:
    """The dtype of integer or float8 storage among a compute op's operands beside a floating one, or None."""
    if str(getattr(func, "overloadpacket", func)) not in _COMPUTE:
        return None
    from torchdoctor._guard.storageuse import stored

    ts = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
    raw = [t for t in ts if stored(t)]
    return dtype_str(raw[0].dtype) if raw and any(t.is_floating_point() and not stored(t) for t in ts) else None


def prove_at_ops(fixes: list[Fix], cases: Sequence[Case], rules: Any, profile: Any,
                 entries: dict[str, tuple[int, list[Any]]] | None = None) -> list[Fix]:
    """Label each fix proven when every failing op it changes runs with all the fixes applied (and it changes at
    least one), else unproven with what was tried and what was still wrong. ``entries`` (layer path -> what it
    was first given): a fix that casts or moves a whole component, or a module held apart, is proven at the
    entries of its layers too: a tensor they are given from outside it would be left behind (the caller's fp32
    input of an encoder cast to bf16) joins the fix, with its own fix (``fixes`` grows), else it is unproven."""
    _at_moves(fixes, cases)
    _at_outputs(fixes, cases)
    results = [(c, *_check(c, fixes, rules, profile)) for c in cases]
    for i, f in enumerate(fixes):
        if f.proven and f.at_op:  # proven on a copy of what it changes before (a host read's ``.cpu()``): kept
            continue
        if f.kind == "factory" and isinstance(f.target, torch.dtype):  # a factory's dtype=: the device holds it
            f.at_op, f.proven = True, profile.supports(f.target, "storage")
            f.tried = f"at the factory: {profile.type} {'holds' if f.proven else 'cannot hold'} " \
                f"{dtype_str(f.target)} tensors"
            continue
        if not f.sets:
            f.proven, f.at_op = False, True
            f.tried = f.tried if f.tried.startswith("not re-run") else \
                "not applied: advice or program state (not a tensor a failing op read), nothing to re-run" \
                if f.code.startswith("#") else "not applied: it acts on program state no failing op's operands show"
            continue
        f.at_op = True
        mine = [(c, left, same) for c, used, left, same in results if i in used]
        if not mine:
            f.proven = False
            far = _far(f, cases)
            f.at_op = not far  # a re-run judges it (simulate), else it stays unproven saying why
            f.tried = f"it changes {far}, which reaches the failing op only through other ops (one may undo it: a " \
                "promotion, another operand): only a re-run of the whole program proves it" if far else \
                "no failing op recorded reads a tensor it changes, so it was not re-run"
            continue
        bad = next(((c, left) for c, left, _ in mine if left is not None), None)
        f.proven = bad is None
        if bad is not None:
            f.tried = f"applied to copies of the operands of {bad[0].where()}, which still found: {bad[1]}"[:400]
        else:
            c, _, same = mine[0]
            more = f" (and {len(mine) - 1} more op(s))" if len(mine) > 1 else ""
            f.tried = (f"at the failing op {c.where()}{more}: its operands as the fix leaves them run with no "
                       "problem" + ("; its output is the one the ops after it ran on" if same else "") +
                       _carried(f, c))
    _left_over(fixes, results, rules, profile)
    if entries:
        from torchdoctor._virtual.entrycheck import entry_check

        entry_check(fixes, entries)
    return fixes


def _carried(f: Fix, case: Case) -> str:
    """How a cast of a caller's argument reached an operand that views it (``; the cast of input 0 (x) carried
    through aten.select to the operand``), or ""."""
    from torchdoctor._virtual.entrycheck import targets

    hit = next((o for o in _operands(case.before) if o.through and any(
        isinstance(t, torch.dtype) for t in targets(o, f))), None)
    if hit is None:
        return ""
    arg = next((n for n, _ in f.sets if n in hit.tags and n.startswith(("input ", "kwarg "))), "the argument")
    return f"; the cast of {arg} carried through {', '.join(dict.fromkeys(hit.through))} to the operand"


def _at_moves(fixes: list[Fix], cases: Sequence[Case]) -> None:
    """A move at the program's own line to a fixed device (``.cuda()``) is fixed at that line, to the device of what
    it meets at the failing op (``moveline``), where both lines can be read; a re-run sends what that line moves to
    the device the fix names (``remake``), so ``simulate`` proves the changed line itself."""
    from torchdoctor._placement import device_str
    from torchdoctor._virtual.moveline import moved_line_fix
    from torchdoctor._virtual.origin import LINES

    for f in fixes:
        tag = next((n for n, t in f.sets if n.startswith("moved a tensor at ") and isinstance(t, torch.device)), None)
        if tag is None or f.diff is not None or f.kind != "note":
            continue
        hit = next(((c, o) for c in cases for o in _operands(c.before) if tag in o.tags), None)
        if hit is None:
            continue
        want = next((o.device for o in _operands(hit[0].before) if o.device != hit[1].device), None)
        at = tag[len("moved a tensor at "):]
        line = moved_line_fix(at, hit[0].at, hit[0].line, device_str(hit[1].device),
                              device_str(want) if want is not None else None)
        if line is not None:
            f.code, f.diff = line[0], line[1]
            if want is not None and at in LINES:
                f.remake = (*LINES[at], line[2], want, None)


def _at_outputs(fixes: list[Fix], cases: Sequence[Case]) -> None:
    """A library's cast by design (``Timesteps``' float32) whose module's output is what a failing op met: fixed at
    the program's line that takes that output back (``libout``), a cast of the operand itself, proven at the op."""
    from torchdoctor._virtual.libout import output_fix

    for f in fixes:
        if f.kind != "note" or f.site is None or f.diff is not None or not isinstance(f.target, torch.dtype):
            continue
        end = f" cast at {f.site.at}"
        hit = next(((c, n) for c in cases if c.own is not None for o in _operands(c.before) for n in o.tags
                    if n.startswith(OUTPUT) and n.endswith(end)), None)
        if hit is None:
            continue
        path, _, cls = hit[1][len(OUTPUT) + 1:-len(end)].partition("` ")
        own = hit[0].own
        line = output_fix(own, path.rsplit(".", 1)[-1], cls, f.site.at, f.target) if path and own else None
        if line is not None:
            f.code, f.diff, f.reout, f.site = *line, None  # its line is the program's now, not the library's
            f.sets = ((hit[1], f.target),)


def _changed_far(case: Case, names: set[str], profile: Any) -> bool:
    """Whether every off operand of ``case`` (a dtype its device cannot hold, or a device the others are not on)
    carries a tensor a fix changes: the op then changes with the fixes, through the ops between."""
    ops = _operands(case.before)
    devices = {o.device for o in ops}
    off = [o for o in ops if not profile.supports(o.meta.dtype, "storage") or len(devices) > 1]
    return bool(off) and all(names & set(o.tags) for o in off)


def _left_over(fixes: list[Fix], results: Sequence[tuple[Case, set[int], str | None, bool]], rules: Any,
               profile: Any) -> None:
    """A fix proven at an op is unproven when the same op at the same line also failed on operands no fix changes
    (a second ``mm`` of the same forward reading another CPU tensor, recorded under the same layer): that failure
    is still there with every fix applied, as a re-run would find."""
    open_ = {c.where(): c for c, used, _, _ in results if not used}
    if not open_:
        return
    names = {n for f in fixes for n, _ in f.sets}
    for i, f in enumerate(fixes):
        if not (f.proven and f.at_op):
            continue
        # an open op whose every off operand carries a tensor some fix changes (a float64 ``sig`` of the fixed cast,
        # met through a select and a sub) is changed too, only through other ops: not a failure no fix changes
        hit = next((open_[c.where()] for c, used, _, _ in results if i in used and c.where() in open_
                    and not _changed_far(open_[c.where()], names, profile)), None)
        if hit is None:
            continue
        found = rules.find(hit.func, *_applied(hit.before, ())[:2], profile)
        said = found[0].problem.message if found else "a failure no fix changes"
        ops = _operands(hit.before)
        odd = [t for o in ops[1:] if o.device != ops[0].device or o.meta.dtype != ops[0].meta.dtype
               for t in o.tags[:1]]
        said += f" ({', '.join(x.removeprefix('factory ') for x in odd)})" if odd else ""
        f.proven = False
        f.tried = f"{f.tried}; but {hit.where()} also failed on an operand no fix changes, still: {said}"[:400]
