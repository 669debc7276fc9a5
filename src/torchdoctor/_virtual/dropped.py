"""A move or cast whose result the program drops: ``x.to(device)`` on a line of its own, after ``x = torch.randn(5,
10)``. ``Tensor.to`` (``.cuda()``, ``.half()``, ...) returns a new tensor and never changes ``x``, unlike
``Module.to`` one line above it; the program meant that line to move ``x``. The fix of the factory's line (``pass
device=``) would work, but leaves the dead line and the misunderstanding in place: the fix is that line, assigned
(``x = x.to(device)``), a diff. Its proof is the factory's (the tensor is on the device from that line on either
way: the re-run makes it there)."""

from __future__ import annotations

import ast
import os
from collections.abc import Sequence
from typing import Any

__all__ = ["dropped_fixes"]

_MOVES = frozenset({"to", "cuda", "cpu", "xpu", "mps", "half", "float", "bfloat16", "double", "type"})


def dropped_fixes(items: Sequence[Any]) -> list[Any]:
    """``items`` with each factory-line fix whose tensor the program then moves or casts on a line that drops the
    result replaced by that line assigned (module doc)."""
    out = list(items)
    for i, f in enumerate(out):
        remake = getattr(f, "remake", None)
        if remake is None:
            continue
        try:
            new = _fixed(f, remake[0], remake[1])
        except Exception:  # a diagnostic never breaks the report: the fix as it was
            new = None
        if new is not None:
            out[i] = new
    return out


def _fixed(f: Any, file: str, line: int) -> Any:
    from dataclasses import replace

    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.devexpr import enclosing, tree_of

    tree = tree_of(file)
    if tree is None:
        return None
    made = next((n for n in ast.walk(tree) if isinstance(n, ast.Assign) and n.lineno == line and
                 len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)), None)
    if made is None:
        return None
    name = made.targets[0].id  # type: ignore[attr-defined]
    fn = enclosing(file, line)
    scope = fn if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else tree
    body = _statements(scope)
    after = [s for s in body if s.lineno > line]
    for s in after:
        if _binds(s, name):
            return None  # rebound before any dropped move: the factory's fix stands
        call = s.value if isinstance(s, ast.Expr) else None
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in _MOVES and \
                isinstance(call.func.value, ast.Name) and call.func.value.id == name and s.end_lineno == s.lineno:
            import linecache

            text = ast.unparse(call)
            raw = linecache.getline(file, s.lineno).rstrip("\r\n")
            diff = line_patch(file, s.lineno, (raw[:s.col_offset] + f"{name} = " + raw[s.col_offset:]).strip())
            if diff is None:
                return None
            at = f"{os.path.basename(file)}:{s.lineno}"
            code = (f"{name} = {text}  # {at}: Tensor.{call.func.attr} returns a new tensor and never changes {name} "
                    f"in place (Module.{'to' if call.func.attr == 'to' else call.func.attr} does): the line dropped "
                    "its result")
            return replace(f, code=code, diff=diff)
    return None


def _statements(scope: ast.AST) -> list[ast.stmt]:
    """The statements of ``scope`` in line order, nested blocks included, nested functions and classes left out."""
    out: list[ast.stmt] = []

    def walk(stmts: Sequence[ast.stmt]) -> None:
        for s in stmts:
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            out.append(s)
            for field in ("body", "orelse", "finalbody"):
                walk(getattr(s, field, []) or [])
            for h in getattr(s, "handlers", []) or []:
                walk(h.body)

    walk(getattr(scope, "body", []))
    return sorted(out, key=lambda s: s.lineno)


def _binds(s: ast.stmt, name: str) -> bool:
    """``s`` itself assigns ``name`` (not its nested blocks: those are visited as statements of their own)."""
    targets: list[ast.expr] = []
    if isinstance(s, ast.Assign):
        targets = list(s.targets)
    elif isinstance(s, (ast.AugAssign, ast.AnnAssign)):
        targets = [s.target]
    elif isinstance(s, (ast.For, ast.AsyncFor)):
        targets = [s.target]
    elif isinstance(s, (ast.With, ast.AsyncWith)):
        targets = [i.optional_vars for i in s.items if i.optional_vars is not None]
    return any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t))
