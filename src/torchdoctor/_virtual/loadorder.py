"""An optimizer's state loaded before its model's move, written as the program's own lines in the other order.

``opt.load_state_dict(ckpt["opt"])`` puts each state tensor on its parameter's device *at the time of the load*
(torch casts the state to the parameter); a ``model.to(device)`` after it moves the parameters and leaves the state
where it was loaded, and the first ``opt.step()`` on an accelerator raises. Where both statements are the program's
own, in one block, the load before the move, the fix is those lines swapped: the load moved to just after the move,
as a unified diff. Lines between the two that read the optimizer, or rebind a name the load reads, keep the fix
advice only (moving the load past them would change what they see).
"""

from __future__ import annotations

import ast
import sys
from typing import Any

from torchdoctor._virtual.heldby import _SKIP  # frames of machinery, not the program

_MOVES = frozenset({"to", "cuda", "xpu", "mps", "npu"})


def own_frame_file() -> str | None:
    """The file of the innermost frame of the program's own code (the one whose step found the state)."""
    from torchdoctor._guard.ownfile import own_file

    f: Any = sys._getframe(1)
    for _ in range(48):
        if f is None:
            return None
        name = f.f_code.co_filename
        if not any(s in name for s in _SKIP) and own_file(name):
            return str(name)
        f = f.f_back
    return None


def load_after_move(file: str, held: str, model: str) -> tuple[str, str, str] | None:
    """(the load's source, the move's source, the diff) where ``file`` loads ``held``'s state before it moves
    ``model`` in one block of statements; None when it does not, or the swap could change what a line between sees."""
    from torchdoctor._report.diff import move_patch
    from torchdoctor._virtual.devexpr import tree_of

    tree = tree_of(file)
    if tree is None:
        return None
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if not isinstance(body, list):
                continue
            loads = [i for i, s in enumerate(body) if _calls(s, held, {"load_state_dict"})]
            moves = [i for i, s in enumerate(body) if _calls(s, model, _MOVES)]
            for i in loads:
                j = next((j for j in moves if j > i), None)
                if j is None or not _untouched(body[i], body[i + 1: j], held):
                    continue
                load, move = body[i], body[j]
                diff = move_patch(file, load.lineno, load.end_lineno or load.lineno, move.end_lineno or move.lineno)
                if diff is not None:
                    return ast.unparse(load), ast.unparse(move), diff
    return None


def _calls(stmt: ast.stmt, name: str, attrs: frozenset[str] | set[str]) -> bool:
    """``name.attr(...)`` as a statement, or assigned (``model = model.to(device)``)."""
    value = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in attrs | _MOVES:
        if value.func.attr in attrs and ast.unparse(value.func.value) == name:
            return True
        value = value.func.value  # a chain: model.to(device).eval() is not matched; model.float().to(device) is
    return False


def _untouched(load: ast.stmt, between: list[ast.stmt], held: str) -> bool:
    """No statement between reads the optimizer or rebinds a name the load reads."""
    reads = {n.id for n in ast.walk(load) if isinstance(n, ast.Name)}
    for stmt in between:
        names = [n for n in ast.walk(stmt) if isinstance(n, ast.Name)]
        if any(n.id == held.split(".")[0] for n in names):
            return False
        if any(isinstance(n.ctx, (ast.Store, ast.Del)) and n.id in reads for n in names):
            return False
    return True


def swapped_load(code: str, diff: str, p: Any, problems: Any) -> Any:
    """The swap as a fix: proven at the step when the run, having put each state tensor on its parameter's device
    (where the load after the move puts it), met no other problem of an optimizer's state."""
    import torch

    from torchdoctor._placement import parse_device
    from torchdoctor._virtual.prove import Fix

    others = [q for q in problems if q is not p and "optimizer.state" in f"{q.path} {q.message}"]
    try:
        target: Any = parse_device(p.expected)
    except (ValueError, TypeError, RuntimeError):
        target = torch.device("cpu")
    fix = Fix(code, "note", target, diff=diff, sets=(("optimizer.state", target),), at_op=True, proven=not others)
    fix.tried = ("at Optimizer.step: each state tensor on its parameter's device, where the load after the move "
                 "puts it; the step then ran with no problem" if not others else
                 f"the step still found: {others[0].message}"[:400])
    return fix


def stepped_before_move(file: str, held: str, model: str) -> tuple[str, int, str, int, str] | None:
    """(the step's source, its line, the move's source, its line, the diff) where ``file`` steps ``held`` (which
    makes its state where the parameters are then) before it moves ``model`` in one block of statements, and no
    state is loaded between: the diff reloads the state after the move (``opt.load_state_dict(opt.state_dict())``,
    which puts each state tensor on its parameter's device). None otherwise."""
    import linecache

    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.devexpr import tree_of

    tree = tree_of(file)
    if tree is None:
        return None
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        steps = [i for i, s in enumerate(body) if any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "step" and
            ast.unparse(n.func.value) == held for n in ast.walk(s)) and not isinstance(s, (ast.For, ast.While))]
        moves = [i for i, s in enumerate(body) if _calls(s, model, _MOVES)]
        for i in steps:
            j = next((j for j in moves if j > i), None)
            if j is None or any(_calls(s, held, {"load_state_dict"}) for s in body[i + 1: j]):
                continue
            move = body[j]
            line = move.end_lineno or move.lineno
            raw = linecache.getline(file, line).rstrip("\r\n")
            if move.lineno != line or not raw.strip():
                return None
            diff = line_patch(file, line, f"{raw.strip()}\n{held}.load_state_dict({held}.state_dict())  # the state "
                                          "on each parameter's device")
            if diff is not None:  # the move's line kept as context, not removed and added again
                diff = diff.replace(f"\n-{raw}\n+{raw}\n", f"\n {raw}\n", 1)
                return ast.unparse(body[i]).splitlines()[0], body[i].lineno, ast.unparse(move), line, diff
    return None
