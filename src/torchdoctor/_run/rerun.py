"""The test a ``@pytest.mark.simulate`` marker runs, run again with its line fixes applied: one verdict with the API.

A block of the user's own code (``virtual_devices``, the marker) proves each fix at the failing ops: copies of their
operands, the fix applied, the op run again. A fix at a line several ops upstream of the failure (``h = x.float()``,
then ``h * 2 + 1``, then the layer) cannot be judged there -- an op in between may undo it -- and is left "unproven:
only a re-run of the whole program proves it", while ``simulate(model, call=app)`` proves the same fix by re-running
``app`` with the line changed. The marker owns its test function, so it can do what ``simulate`` does: it calls the
test again on virtual devices with the fixes that act at a line of the code (a cast written to the fixed dtype, a
factory call made with the fixed device or dtype, a module cast of the program's own line), through ``simulate``'s
own re-run (``call=``, the fixes applied there, never to the user's objects: the test builds its own again).

The re-run proves a fix when no problem is left that names its line, none is new and every one left is another
printed fix's (judged at its op, or changing a tensor it names: proven at the op, or advice); a problem left that no
fix printed here addresses leaves the fix unproven, as ``simulate``'s re-run of every fix together would. A re-run that raises leaves the fix unproven, saying what it raised.
``torchdoctor run`` does not re-run a whole program: a program writes files, downloads, prints -- running it twice is
not free of effects -- so its far fixes keep saying that only a re-run proves them (``simulate(call=...)`` or the marker
do it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any


def at_lines(fixes: Sequence[Any]) -> list[Any]:
    """The fixes left unproven that a re-run can apply without the model (they act at a line of the code)."""
    from torchdoctor._virtual.prove import judged_at_op

    return [f for f in fixes if not f.proven and not judged_at_op(f) and f.applied()
            and (f.kind == "line" or f.remake is not None or f.modcast is not None or f.noscale is not None)]


_UNSCALE = "aten._amp_foreach_non_finite_check_and_unscale_"


def _line_of(f: Any) -> str | None:
    """``app.py:12``, the line a fix changes, as problems quote it."""
    if f.site is not None:
        return str(f.site.at)
    place = f.remake or f.modcast
    return f"{os.path.basename(place[0])}:{place[1]}" if place else None


def test_call(item: Any) -> Callable[[Any], Any] | None:
    """A call of the test function of ``item`` with the fixtures it was given; None where the test cannot be called
    again here (a coroutine, no function)."""
    import inspect

    fn = getattr(item, "obj", None)
    funcargs = getattr(item, "funcargs", None)
    if fn is None or funcargs is None or inspect.iscoroutinefunction(fn):
        return None
    try:
        names = [n for n in inspect.signature(fn).parameters if n in funcargs]
    except (TypeError, ValueError):
        return None
    return lambda _copy: fn(**{n: funcargs[n] for n in names})


def prove_by_rerun(session: Any, call: Callable[[Any], Any], data: str = "cpu") -> bool:
    """Re-run ``call`` on virtual devices with the line fixes of ``session`` applied; each gets its verdict (``proven``,
    ``tried``) in place. True when any fix was re-run."""
    import torch

    from torchdoctor._virtual.simulate import simulate

    fixes = at_lines(session.fixes)
    if not fixes:
        return False
    try:
        left = list(simulate(torch.nn.Module(), device=session.device, dtype=session.dtype, call=call, data=data,
                             profile=session.profile, _fixes=fixes).problems)  # with the marker's count
    except Exception as exc:  # the re-run is the proof: a failure of it leaves the fix unproven, never the report
        first = (str(exc).strip().splitlines() or [""])[0]
        for f in fixes:
            f.rerun, f.at_op, f.proven = True, False, False
            f.tried = f"applied in a virtual re-run of the test, which raised {type(exc).__name__}: {first}"[:400]
        return True
    left = [p for p in left if p.kind != "memory"]
    before = {(p.kind, p.path) for p in session.problems}
    new = [p for p in left if (p.kind, p.path) not in before]
    others = [g for g in session.fixes if not any(g is f for f in fixes)]
    for f in fixes:
        line = _line_of(f)
        still = [p for p in left if line and line in (p.message or "") or f.noscale is not None and str(
            p.op or "").startswith(_UNSCALE)]  # a fix with no GradScaler: no unscale is left
        still += [p for p in left if p not in still and not any(_covers(g, p) for g in others)]  # nobody's: not gone
        f.rerun, f.at_op = True, False
        f.proven = not new and not still
        f.tried = ("applied in a virtual re-run of the test: no problem left" if not left else
                   "applied in a virtual re-run of the test: what is left is another fix's" if f.proven else
                   f"applied in a virtual re-run of the test, which still found: {(still or new)[0].message}")[:400]
    return True


def _covers(g: Any, p: Any) -> bool:
    """Another printed fix ``g`` addresses the problem ``p`` the re-run left: it was judged at ``p``'s op, or it
    changes a tensor ``p`` names (its module path, its maker or cast line, as the operand tags quote them)."""
    if p.op and f"at the failing op {p.op}" in (g.tried or ""):
        return True
    text = p.message or ""
    for name, _ in g.sets:
        name = str(name)
        if name == "*" or name == p.path or name.endswith(".") and (p.path + ".").startswith(name):
            return True
        at = name.rpartition(" at ")[2]
        if at and at != name and at in text:
            return True
    return False


def patch_lines(fixes: Sequence[Any]) -> list[str]:
    """``Patch (git apply):`` and the diff of each proven fix that changes a line of the user's file."""
    return [line for f in fixes if f.proven and f.diff for line in ("Patch (git apply):", *(
        f"    {x}" for x in f.diff.splitlines()))]


def rerun_error(item: Any, session: Any, data: str = "cpu") -> Exception | None:
    """The marker's error for ``session``: its far line fixes judged by a virtual re-run of the test of ``item``, the
    diff of each one proven, as ``simulate`` prints it; None when no fix needed the re-run (the error stands)."""
    call = test_call(item)
    if call is None or not prove_by_rerun(session, call, data):
        return None
    err, patch = session.error(), patch_lines(session.fixes)
    return type(err)("\n".join([str(err), *patch]), module_path=err.module_path, module_type=err.module_type,
                     op=err.op, tensors=err.tensors, problems=err.problems, fix=err.fix) if patch else err


WHOLE = "only a re-run of the whole program proves it"  # what a fix judged nowhere says (``atop``)


def said_why_not(fixes: Sequence[Any]) -> tuple[Any, ...]:
    """``torchdoctor run``'s fixes, each that only a re-run proves saying why run does not re-run the program."""
    for f in fixes:
        if not f.proven and WHOLE in (f.tried or "") and "runs a program once" not in f.tried:
            f.tried = (f"{f.tried}; torchdoctor run runs a program once (a second run would write its files and "
                       "output again): simulate(model, call=...) or @pytest.mark.simulate re-run it")[:500]
    return tuple(fixes)
