"""A fix of a virtual run is printed as proven only after it was tried: ``simulate`` runs the same check again on a
fresh copy with the fix applied (its code executed on the copy, with ``model`` naming it; a cast at a line of the
user's code made to write the fixed dtype in that re-run; an input cast as the fix says) and the fix is proven when
that re-run has no problem left and no new one. Otherwise it is labelled unproven, with what was tried and what the
re-run still found. Advice that is not code (load the weights, register a buffer) is never applied, and says so.

Nothing the user holds is touched: the re-run works on its own copy, as the first run did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from torchdoctor._report.model import Problem


@dataclass
class Fix:
    """One fix of a virtual run: code (or advice, ``kind="note"``) and whether a re-run proved it."""

    code: str
    kind: str  # "path": code run on the copy; "line": a cast at a line of the user's code; "input"; "note";
    # "apart": a module the program holds apart from the model, moved where it is built (``apart``)
    target: Any = None  # the device or dtype the fix sets
    label: str = ""  # an input's name (``input 0``, ``kwarg mask``) for kind "input"
    site: Any = None  # the ``castsites.CastSite`` of a kind "line" fix
    proven: bool = False
    tried: str = ""  # what the proof did and what it found
    diff: str | None = None  # a unified diff of the user's file, where the fix is a line there
    # (name, device / dtype / both) of each tensor the fix changes, by the names a failing op's operands carry
    # (path, maker, cast line, argument; ``*``: every model tensor): how a block's fix is proven at the op (atop)
    sets: tuple[tuple[str, Any], ...] = ()
    at_op: bool = False  # judged at the failing ops (``atop.prove_at_ops``), not by a re-run
    rerun: bool = False  # judged by a virtual re-run (``proven``)
    asks: torch.dtype | None = None  # the dtype the run asks for once it is applied (a switch bf16 -> fp16 on a T4)
    # a factory call fixed at its line: (file, line, function name, device, dtype), made so in a re-run (``remake``)
    remake: tuple[str, int, str, Any, Any] | None = None
    modcast: tuple[str, int, torch.dtype] | None = None  # a module cast of the program's line (file, line) fixed to
    # that dtype in a re-run (``modcast``)
    rebuffer: tuple[str, ...] = ()  # plain attributes registered as buffers in a re-run (``hooked``)
    recall: Any = None  # a call of the program given its missing device= (``callsite.Recall``), so in a re-run
    reglobal: tuple[dict[str, Any], str, Any] | None = None  # (globals, name, value): a module-level device pick
    # set so in a re-run (``globaldev``)
    rebuild: tuple[type, str, int, tuple[Any, ...]] | None = None  # modules of a class built at (file, line) moved
    # there in a re-run (``builtat``)
    reoperand: tuple[str, int, str, str | None, Any] | None = None  # an operand fixed at a call (``operandfix``)
    renumpy: tuple[str, int] | None = None  # a line whose .numpy() reads float32 in a re-run (``intread``)
    # a library module's output cast where the program's line takes it back: (file, line, class, dtype) (``libout``)
    reout: tuple[str, int, str, torch.dtype] | None = None
    noscale: str | None = None  # a device type trained with bfloat16 autocast and no GradScaler in a re-run (``noscale``)
    # a line of the program whose value is cast back to the data's dtype: (file, line, dtype) (``widened``)
    rewiden: tuple[str, int, torch.dtype] | None = None

    def applied(self) -> bool:
        """A fix a re-run can apply (advice cannot)."""
        return self.kind in ("path", "line", "apart") or self.remake is not None or self.modcast is not None or \
            bool(self.rebuffer) or self.recall is not None or self.reglobal is not None or \
            self.rebuild is not None or self.reoperand is not None or self.renumpy is not None or \
            self.reout is not None or self.noscale is not None or self.rewiden is not None or (
            self.kind == "input" and isinstance(self.target, torch.dtype) and self.label.startswith(("input ", "kwarg ")))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "kind": self.kind, "proven": self.proven, "tried": self.tried}
        if self.site is not None:
            out["at"] = self.site.at
        if self.diff is not None:
            out["diff"] = self.diff
        return out


def apply_fixes(model: Any, fixes: Sequence[Fix]) -> None:
    """Run each code fix on ``model`` (a copy: the fix's ``model`` is it), as the user would paste it."""
    import torchdoctor

    for f in fixes:
        if f.rebuffer:
            rebuffered(model, f.rebuffer)
        if f.kind == "path":
            names: dict[str, Any] = {"model": model, "torch": torch, "torchdoctor": torchdoctor}
            while True:  # the model by the program's own name for it in the fix (``m`` of a simulate's call=)
                try:
                    exec(compile(f.code, "<torchdoctor fix>", "exec"), names)  # noqa: S102
                    break
                except NameError as exc:
                    if not exc.name or exc.name in names or len(names) > 4:
                        raise
                    names[exc.name] = model


def rebuffered(model: Any, paths: tuple[str, ...]) -> None:
    """Each plain tensor attribute at ``paths`` of ``model`` (a copy) made a non-persistent buffer, as a fix's
    ``register_buffer`` line makes it (``hooked``)."""
    for path in paths:
        prefix, _, name = path.rpartition(".")
        mod = model.get_submodule(prefix) if prefix else model
        value = vars(mod).get(name)
        if isinstance(value, torch.Tensor):
            del mod.__dict__[name]
            mod.register_buffer(name, value, persistent=False)


_NOT_THERE = (AttributeError, IndexError, KeyError)  # a fix's path the model does not hold (yet)


@contextmanager
def applied_when_there(model: Any, fixes: Sequence[Fix]) -> Iterator[None]:
    """While ``call(model)`` runs in a re-run: each code fix applied before the call, as ``apply_fixes`` does; one
    whose path the model does not hold yet (a block the program appends after its own ``.to``: ``model.blocks[1]``)
    is applied when it first can, as a module's forward starts. One never applied raises what it raised, after the
    call: the fix is then unproven, saying so."""
    from torchdoctor._virtual.noscale import unscaled

    with unscaled(fixes), _applied_when_there(model, fixes):
        yield


@contextmanager
def _applied_when_there(model: Any, fixes: Sequence[Fix]) -> Iterator[None]:
    pending: list[tuple[Fix, BaseException]] = []
    for f in fixes:
        try:
            apply_fixes(model, (f,))
        except _NOT_THERE as exc:
            pending.append((f, exc))
    if not pending:
        yield
        return

    def retry(_mod: Any, _args: Any) -> None:
        for item in list(pending):
            try:
                apply_fixes(model, (item[0],))
            except _NOT_THERE:
                continue
            pending.remove(item)

    handle = torch.nn.modules.module.register_module_forward_pre_hook(retry)
    try:
        yield
    finally:
        handle.remove()
    if pending:
        raise pending[0][1]


def switch_advice(f: Fix) -> Fix:
    """A switch of the dtype the run computes in (``model.to(torch.float16)`` where the device has no bfloat16) when
    the caller's own code casts the model (``call=``, ``torchdoctor run``): a cast before that code runs is undone by
    it, so the switch is made where that code casts, and said as advice, never as a line proven by a re-run."""
    what = f.code.split("#", 1)[1].strip() if "#" in f.code else "the device cannot compute in the dtype asked"
    new = str(f.asks)[6:]
    return Fix(f"# {what}: where your code casts the model (and makes its inputs) in the dtype asked, use "
               f"torch.{new} instead (m.to(device, torch.{new}))", "note", f.asks,
               tried="not re-run: call= casts the model itself, so a cast before it would be undone")


def before_move(fixes: Sequence[Fix]) -> list[Fix]:
    """The fixes that only cast named tensors: a re-run applies them before the move too (a float8 weight is cast
    before it moves to MPS, which refuses to hold it), as well as after it."""
    return [f for f in fixes if f.kind == "path" and f.sets and all(
        isinstance(t, torch.dtype) and n != "*" for n, t in f.sets)]


def recasts(fixes: Sequence[Fix]) -> dict[tuple[Any, ...], torch.dtype]:
    """The lines a re-run makes cast to the fixed dtype: ``(file, line) -> dtype``; and ``(file, line, "widened")
    -> dtype``, the lines whose promoted values a re-run casts back to the data's dtype (``widened``)."""
    out: dict[tuple[Any, ...], torch.dtype] = {
        (f.site.file, f.site.lineno): f.target for f in fixes
        if f.kind == "line" and f.site is not None and isinstance(f.target, torch.dtype)}
    out.update({(*f.rewiden[:2], "widened"): f.rewiden[2] for f in fixes if f.rewiden is not None})
    return out


def fixed_inputs(args: tuple[Any, ...], kwargs: dict[str, Any], fixes: Sequence[Fix]
                 ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The inputs as the fix passes them (``input 0`` cast to the fixed dtype); new tensors, the caller's untouched."""
    new_args, new_kwargs = list(args), dict(kwargs)
    for f in fixes:
        if f.kind != "input" or not f.applied():
            continue
        name = f.label.split(" ", 1)[1].split(" ", 1)[0]
        if f.label.startswith("input ") and name.isdigit() and int(name) < len(new_args) and \
                isinstance(new_args[int(name)], torch.Tensor):
            new_args[int(name)] = new_args[int(name)].to(f.target)
        elif f.label.startswith("kwarg ") and isinstance(new_kwargs.get(name), torch.Tensor):
            new_kwargs[name] = new_kwargs[name].to(f.target)
    return tuple(new_args), new_kwargs


@contextmanager
def inputs_cast(root: Any, fixes: Sequence[Fix]) -> Iterator[None]:
    """While ``call(root)`` runs in a re-run: the arguments of each call of ``root`` as the input fixes pass them
    (``input 1 (t)`` cast to the fixed dtype), the caller's code untouched."""
    if not isinstance(root, torch.nn.Module) or not any(f.kind == "input" and f.applied() for f in fixes):
        yield
        return
    handle = root.register_forward_pre_hook(lambda _m, a, k: fixed_inputs(a, k, fixes), with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def proven(fixes: list[Fix], rerun: Callable[[list[Fix]], Sequence[Problem]],
           at_op: Callable[[list[Fix]], Any] | None = None, before: Sequence[Problem] = ()) -> list[Fix]:
    """Try the fixes together in a re-run; each applied one is proven when nothing is left, else says what was.
    With ``at_op`` (the run's failing ops, as ``virtual_devices``, ``run`` and the marker judge a fix), a fix judged
    there keeps that verdict, so one case gets one verdict whatever found it; the re-run judges the rest. A fix
    proven at the op is still unproven when the re-run finds a problem the first run (``before``) did not have: the
    failure is gone only without a new one (a cast that now meets the caller's fp32 input upstream)."""
    if at_op is not None:
        try:
            at_op(fixes)
        except Exception as exc:  # the proof at the op is extra: the re-run judges every fix then
            for f in fixes:
                f.proven, f.at_op, f.tried = False, False, f"the proof at the failing op failed: {exc}"[:400]
    open_ = [f for f in fixes if not judged_at_op(f)]
    code = [f for f in fixes if f.applied()]
    for f in open_:
        if not f.applied() and not f.at_op:
            f.tried = "not applied: advice, not code a re-run can apply"
    if not code:
        return fixes
    try:
        left = [p for p in rerun(code) if p.kind != "memory"]
    except Exception as exc:  # the fix itself failed: unproven, with why; never a crash of the report
        first = (str(exc).strip().splitlines() or [""])[0]
        for f in code:
            f.at_op, f.rerun, f.proven = False, True, False
            f.tried = f"applied in a virtual re-run, which raised {type(exc).__name__}: {first}"[:400]
        return fixes
    for f in code:
        if judged_at_op(f):  # proven at the op, unless the re-run still finds a tensor it sets wrong (code in the
            names = {n for n, _ in f.sets}  # forward that undoes it on every call)
            still = [p for p in left if p.path in names or "*" in names]
            had = {(p.kind, p.path) for p in before}
            new = [p for p in left if (p.kind, p.path) not in had] if before else []
            # the very failure it was proven at is still there (another operand of the op, made elsewhere, is wrong too)
            at = {(p.kind, p.path, p.op) for p in before if p.op and f"at the failing op {p.op}" in f.tried}
            still += [p for p in left if (p.kind, p.path, p.op) in at and p not in still]
            if f.proven and (still or new):
                f.proven = False
                f.tried = f"{f.tried}; but a virtual re-run with it applied still found: {still[0].message}"[:400] \
                    if still else f"{f.tried}; but a virtual re-run with it applied {NEW}: {new[0].message}"[:400]
            elif f.proven and f.diff and not left:  # the changed line itself ran in the re-run: said so
                f.rerun, f.tried = True, f"{f.tried}; a virtual re-run with the line changed: no problem left"[:400]
            continue
        f.at_op, f.rerun, f.proven = False, True, not left
        how = next((f" asking {str(g.asks)[6:]}, the dtype it switches to" for g in code if g.asks), "")
        f.tried = f"applied in a virtual re-run{how}: no problem left" if not left else \
            f"applied in a virtual re-run{how}{',' if how else ''} which still found: {left[0].message}"[:400]
    return fixes


NEW = "found a new problem"  # what a fix proven at the op is labelled with when the re-run meets a new failure
STORED = "storage directly (a layer that dequantizes it is bypassed)"  # what ``atop`` finds still wrong then


def judged_at_op(f: Fix) -> bool:
    """The failing ops gave ``f`` a verdict (they met a tensor it changes)."""
    return f.at_op and bool(f.sets) and not f.tried.startswith(("no failing op", "the proof at the failing op"))


def held(obj: Any) -> dict[str, tuple[torch.dtype, torch.device]]:
    """Each tensor ``obj`` holds, by path: its dtype and (virtual) device now, which a fix must change."""
    from torchdoctor._walk import walk

    return {e.path: (e.tensor.dtype, getattr(e.tensor, "_td_device", e.tensor.device)) for e in walk(obj).entries}


def patch_of(fixes: Sequence[Fix]) -> list[str]:
    """The fixes as diffs of the user's own files: one patch ``git apply`` takes whole where several fixes change
    nearby lines (each one-line diff quotes the other's old line as context, so the second would not apply)."""
    from torchdoctor._report.diff import merged

    diffs = list(dict.fromkeys(f.diff for f in fixes if f.diff and not refuted(f)))
    one = merged(diffs) if len(diffs) > 1 else None
    return [one] if one else diffs


def refuted(f: Fix) -> bool:
    """A line fix whose re-run still found a problem at the very line it changes, or whose failing op still computes
    with stored integers with every fix applied: its diff is never offered (the headline says what was found)."""
    if f.proven or not f.diff or "still found" not in f.tried:
        return False
    if f.at_op and STORED in f.tried:  # the failing op, with every fix applied, still computes with integer storage:
        return True  # no cast of another operand makes it pass (other refusals there may be a copy's: zeros_like)
    found = f.tried.split("still found", 1)[1]
    lines = f.diff.splitlines()
    name = next((x[6:].rsplit("/", 1)[-1] for x in lines if x.startswith("--- a/")), None)
    hunk = next((x for x in lines if x.startswith("@@ -")), None)
    if name is None or hunk is None:
        return False
    n = int(hunk[4:].split(",", 1)[0].split(" ", 1)[0])
    for x in lines[lines.index(hunk) + 1:]:
        if x.startswith("-"):
            return f"{name}:{n}" in found
        n += 1
    return False


def fix_text(fixes: Sequence[Fix]) -> list[str]:
    """The report's fix lines: a headline saying whether the fix was proven, then the code."""
    if not fixes:
        return []
    patches = [line for d in patch_of(fixes) for line in ("Patch (git apply):", *(f"    {x}" for x in d.splitlines()))]
    if any(f.at_op for f in fixes):
        return ["Fix:", *(f"    {line}" for line in proof_lines(fixes)), *patches]
    code = [f for f in fixes if f.applied()]
    asks = next((f" asking {str(f.asks)[6:]}, the dtype it switches to," for f in code if f.asks), "")
    if code and all(f.proven for f in code):
        head = f"Fix (proven: a virtual re-run with it applied{asks} has no problem left):"
    elif code:
        head = f"Fix (unproven: {code[0].tried}):"
    else:
        head = "Fix (unproven: advice only, nothing a re-run could apply):"
    return [head, *(f"    {line}" for line in dict.fromkeys(x for f in fixes for x in f.code.splitlines())), *patches]


def proof_lines(fixes: Sequence[Fix]) -> list[str]:
    """The fix as text: each part's code, then whether it was proven (``# fix proven (at the failing op …)``)."""
    judged = [f for f in fixes if f.sets or f.rerun]
    lines = list(dict.fromkeys(line for f in fixes for line in f.code.splitlines()))  # each line once
    if judged and all(f.proven for f in judged):
        return [*lines, f"# fix proven ({judged[0].tried})"]
    out: list[str] = []
    for f in fixes:
        new = [x for x in f.code.splitlines() if x not in out]
        out += new
        if (f.sets or f.rerun) and not f.proven and (new or not f.code.strip()):  # one verdict per line said
            out.append(f"# ^ fix unproven: {f.tried}" if any(g.proven for g in judged) else "")
    first = next((f for f in judged if not f.proven), None) or (fixes[0] if fixes else None)
    tried = first.tried if first is not None and first.tried else "nothing a failing op read was changed"
    return [x for x in out if x] + ([] if any(g.proven for g in judged) else [f"# fix unproven: {tried}"])
