"""The maker of an operand made by a function that has already returned: ``update = zeropower(momentum)`` whose
``return (...).float()`` made the float32 that reaches ``state.lerp_(v_mean, ...)`` two lines later.

A frame's own casts and factories are named by ``_guard/maker.py`` while they run. A cast inside a helper that has
returned leaves no frame, so it is read from the code instead, never run: the culprit's newest assignment before the
failing line in the user's function, followed back through the names it reads that hold the culprit's dtype (at most
a few steps), to a cast written there or to a call of the user's own function whose ``return`` casts to that dtype.
"""

from __future__ import annotations

import ast
import types
from typing import Any

import torch

_METHODS = {"float": torch.float32, "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16}
_DEPTH = 4


def returned_maker(frame: Any, name: str, lineno: int, dtype: torch.dtype) -> str | None:
    """``v_mean made by `.float()` at f.py:7 (`return ...`) in zeropower(), called at f.py:10 (`update = ...`),
    through update`` for a local ``name`` of ``frame`` holding ``dtype`` at ``lineno``; None when the code says
    nothing sure."""
    from torchdoctor._guard.maker import _parsed as parsed_code

    parsed = parsed_code(frame.f_code)
    if parsed is None:
        return None
    tree, off, path, lines = parsed
    through: list[str] = []
    todo: list[tuple[str, int]] = [(name, lineno)]
    seen: set[str] = set()
    while todo and len(seen) < _DEPTH:
        var, before = todo.pop(0)
        if var in seen:
            continue
        seen.add(var)
        node = _assignment(tree, off, var, before)
        if node is None:
            continue
        at = node.lineno + off
        for call in _calls(node.value):
            if _cast_to(call, frame) == dtype:
                return _said(name, f"`.{_attr(call)}()`" if not call.args else f"`{ast.unparse(call.func)}(...)`",
                             path, at, lines, node.lineno, through)
            fn = _user_function(call, frame)
            if fn is not None:
                made = _return_cast(fn, dtype)
                if made is not None:
                    where, src, what = made
                    call_src = _src(lines, node.lineno)
                    return (f"{name} made by {what} at {where} (`{src}`) in {fn.__name__}(), called at "
                            f"{path}:{at} (`{call_src}`)" + (f", through {', '.join(through)}" if through else ""))
        for n in ast.walk(node.value):
            if not (isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)) or n.id in seen:
                continue
            v = frame.f_locals.get(n.id)
            if isinstance(v, torch.Tensor) and v.dtype == dtype:
                through.append(n.id)
                todo.append((n.id, at))
    return None


def _assignment(tree: ast.AST, off: int, var: str, before: int) -> ast.Assign | None:
    best = None
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign) and n.lineno + off < before and any(
                isinstance(t, ast.Name) and t.id == var for t in n.targets):
            best = n if best is None or n.lineno > best.lineno else best
    return best


def _calls(node: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


def _attr(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else ""


def _cast_to(call: ast.Call, frame: Any) -> Any:
    """The dtype a ``.float()`` / ``.to(torch.float32)`` / ``.to(dtype=...)`` call casts to (None: no cast)."""
    attr = _attr(call)
    if attr in _METHODS and not call.args:
        return _METHODS[attr]
    if attr in ("to", "type"):
        for a in [*call.args, *(k.value for k in call.keywords if k.arg == "dtype")]:
            text = ast.unparse(a)
            if text.startswith("torch.") and isinstance(getattr(torch, text[6:], None), torch.dtype):
                return getattr(torch, text[6:])
            if isinstance(a, ast.Name) and frame is not None:
                v = frame.f_locals.get(a.id, frame.f_globals.get(a.id))
                if isinstance(v, torch.dtype):
                    return v
    return None


def _user_function(call: ast.Call, frame: Any) -> types.FunctionType | None:
    """The plain Python function of the user's that a call names (never torch's or a library's)."""
    if not isinstance(call.func, ast.Name):
        return None
    fn = frame.f_locals.get(call.func.id, frame.f_globals.get(call.func.id))
    if not isinstance(fn, types.FunctionType) or (fn.__module__ or "").startswith(("torch", "torchdoctor")):
        return None
    return fn


def _return_cast(fn: types.FunctionType, dtype: torch.dtype) -> tuple[str, str, str] | None:
    """(file:line, source, what) of a ``return`` of ``fn`` whose outermost call casts to ``dtype``."""
    from torchdoctor._guard.maker import _parsed as parsed_code

    parsed = parsed_code(fn.__code__)
    if parsed is None:
        return None
    tree, off, path, lines = parsed
    for n in ast.walk(tree):
        if isinstance(n, ast.Return) and isinstance(n.value, ast.Call) and _cast_to(n.value, None) == dtype:
            what = f"`.{_attr(n.value)}()`" if not n.value.args else f"`{ast.unparse(n.value.func)}(...)`"
            return f"{path}:{n.lineno + off}", _src(lines, n.lineno), what
    return None


def _src(lines: list[str], n: int) -> str:
    return lines[n - 1].strip() if 0 < n <= len(lines) else ""


def _said(name: str, what: str, path: str, at: int, lines: list[str], n: int, through: list[str]) -> str:
    return f"{name} made by {what} at {path}:{at} (`{_src(lines, n)}`)" + (
        f", through {', '.join(through)}" if through else "")
