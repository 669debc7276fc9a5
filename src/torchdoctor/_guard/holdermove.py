"""The line that moved an object the program holds (an EMA copy, ``ema = copy.deepcopy(model).cpu()``, or a later
``ema.to("cpu")``) to the device its tensors are found on: the maker of every tensor it holds there, read from the
program's source around the line where the tensor was met (nothing is run). Used by guard and by a virtual run's
fix for a held module's tensors (``ema.0.weight is on cpu``): the move is named, never "made before the move"."""

from __future__ import annotations

import ast
import functools
import linecache
import os
from typing import Any

_MOVES = {"cpu": "cpu", "cuda": "cuda", "xpu": "xpu", "mps": "mps"}


@functools.lru_cache(maxsize=64)
def _tree(path: str, size: int) -> ast.Module | None:
    try:
        return ast.parse("".join(linecache.getlines(path)))
    except (SyntaxError, ValueError):
        return None


def _to_device(call: ast.Call) -> str | None:
    """The device type a ``.to(...)`` call names as a literal (``"cpu"``, ``device="cuda:0"``,
    ``torch.device("cpu")``), or None."""
    given = [*call.args[:1], *(k.value for k in call.keywords if k.arg == "device")]
    for a in given:
        if isinstance(a, ast.Call) and ast.unparse(a.func) in ("torch.device", "device") and a.args:
            a = a.args[0]
        if isinstance(a, ast.Constant) and isinstance(a.value, str):
            return a.value.split(":", 1)[0]
    return None


def _moves(node: ast.AST, device: str) -> ast.Call | None:
    """The call in ``node``'s expression that moves to ``device`` (``.cpu()``, ``.to("cpu")``), or None."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
            if _MOVES.get(n.func.attr) == device and not n.args:
                return n
            if n.func.attr == "to" and _to_device(n) == device:
                return n
    return None


def moved_at(path: str, lineno: int, holder: str, device: str) -> tuple[str, int, str, str] | None:
    """(file, line, source, the move) of the newest statement before ``path:lineno``, in the function around it, that
    binds ``holder`` to a value moved to ``device`` (a device type) or moves ``holder`` there in place."""
    lines = linecache.getlines(path)
    tree = _tree(path, len(lines)) if lines and os.path.isfile(path) else None
    if tree is None:
        return None
    scope: Any = tree
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.lineno <= lineno <= (n.end_lineno or 0):
            if scope is tree or n.lineno >= scope.lineno:
                scope = n
    best: tuple[int, ast.Call] | None = None
    for n in ast.walk(scope):
        if not isinstance(n, (ast.Assign, ast.Expr)) or n.lineno >= lineno:
            continue
        if isinstance(n, ast.Assign):
            if not any(isinstance(t, ast.Name) and t.id == holder for t in n.targets):
                continue
            call = _moves(n.value, device)
        else:
            call = _moves(n.value, device)
            root: Any = call.func.value if call is not None and isinstance(call.func, ast.Attribute) else None
            call = call if isinstance(root, ast.Name) and root.id == holder else None
        if call is not None and (best is None or n.lineno > best[0]):
            best = (n.lineno, call)
    if best is None:
        return None
    call = best[1]
    move = "." + ast.unparse(call)[len(ast.unparse(call.func.value)) + 1:] if isinstance(call.func, ast.Attribute) \
        else ast.unparse(call)
    return path, best[0], lines[best[0] - 1].strip(), move


def describe(path: str, lineno: int, holder: str, device: str) -> str | None:
    """``ema was moved to cpu by `.cpu()` at ema.py:4 (`ema = copy.deepcopy(m).cpu()`)``, or None."""
    got = moved_at(path, lineno, holder, device)
    if got is None:
        return None
    return f"{holder} was moved to {device} by `{got[3]}` at {os.path.basename(got[0])}:{got[1]} (`{got[2]}`)"
