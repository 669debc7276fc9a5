"""A holder the program filled and then handed to a function of its own that writes its tensors back in another
dtype (a KV cache compressed after the prefill: ``compress_kv_cache(cache)`` whose helper returns ``.half()``): the
off dtype came from that writeback, not from the fill. ``writeback`` names the program's line that handed the
holder over and the cast inside the function (one call deep into the program's own helpers), read from the source,
never run."""

from __future__ import annotations

import ast
import os
from typing import Any

__all__ = ["writeback"]

_CASTS = {"half": "float16", "float": "float32", "double": "float64", "bfloat16": "bfloat16"}
_DEPTH = 2  # the function the program called, and the helpers of its own it calls


def writeback(frame: Any, stmts: list[tuple[ast.stmt, int, str]], pname: str, odd: str) -> str | None:
    """``stmts``: (statement, its line, its text) of the program's code after the fill of ``pname`` and before its
    use. The first that hands ``pname`` to a function of the program's own file that casts: what to say (``odd``: the
    dtype the op met), else None."""
    for stmt, line, text in stmts:
        for call in (c for c in ast.walk(stmt) if isinstance(c, ast.Call)):
            given = [*call.args, *(k.value for k in call.keywords)]
            if not any(isinstance(x, ast.Name) and x.id == pname for a in given for x in ast.walk(a)):
                continue
            fn = _resolve(call.func, frame.f_locals, frame.f_globals)
            cast = _cast_in(fn, _DEPTH) if fn is not None else None
            if cast is not None:
                where = f"{os.path.basename(frame.f_code.co_filename)}:{line}"
                then = f", which {odd} is" if cast[2] in ("", odd) else \
                    f"; the model's new entries joined to {cast[2]} ones promote them to {odd}"
                return (f"`{pname}` was written back at {where} (`{text}`) after it was filled: `{fn.__name__}` casts "
                        f"its tensors at {cast[0]} (`{cast[1]}`){then}")
    return None


def _resolve(func: ast.expr, local: dict[str, Any], glob: dict[str, Any]) -> Any:
    """The plain Python function a call's name means, when it is the program's own (not a library's)."""
    from torchdoctor._guard.ownfile import own_file

    if not isinstance(func, ast.Name):
        return None
    fn = local.get(func.id, glob.get(func.id))
    code = getattr(fn, "__code__", None)
    return fn if code is not None and own_file(code.co_filename) else None


def _cast_in(fn: Any, depth: int) -> tuple[str, str, str] | None:
    """(``file:line``, the line's text, the dtype's name or "") of the first floating dtype cast in ``fn``'s body
    (``.half()``, ``.to(torch.float16)``), or in a helper of the program's own it calls, ``depth`` calls deep; None
    when none."""
    from torchdoctor._virtual.ownline import source

    code = fn.__code__
    got = source(code.co_filename)
    if got is None:
        return None
    tree, text = got
    node = min((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and
                n.name == code.co_name), key=lambda n: abs(n.lineno - code.co_firstlineno), default=None)
    if node is None:
        return None
    lines = text.splitlines()
    calls = sorted((c for c in ast.walk(node) if isinstance(c, ast.Call)), key=lambda c: (c.lineno, c.col_offset))
    for c in calls:
        f = c.func
        named = [ast.unparse(a) for a in [*c.args, *(k.value for k in c.keywords if k.arg == "dtype")]]
        said = [n for n in named if n.startswith("torch.") and "device" not in n]
        if isinstance(f, ast.Attribute) and (f.attr in _CASTS and not c.args or f.attr == "to" and said):
            name = _CASTS[f.attr] if f.attr in _CASTS else said[0].removeprefix("torch.")
            return f"{os.path.basename(code.co_filename)}:{c.lineno}", lines[c.lineno - 1].strip(), \
                {"half": "float16", "float": "float32", "double": "float64"}.get(name, name)
    if depth <= 1:
        return None
    for c in calls:
        inner = _resolve(c.func, {}, fn.__globals__)
        found = _cast_in(inner, depth - 1) if inner is not None and inner is not fn else None
        if found is not None:
            return found
    return None
