"""The line that last bound a name the failing line hands over (``_guard/rawarg.py``), said with what gave it its
dtype: ``torch.from_numpy`` (numpy's uint8 data keeps its dtype), a ``.float()`` cast in an arithmetic (``ids *
keep.float()`` promotes integer ids; ``ids * keep`` with the bool mask would not), else the line itself. Read from the
program's source, never run."""

from __future__ import annotations

import ast
import linecache
import os
import re
from typing import Any

import torch

from torchdoctor._placement import dtype_str


def _chain(node: ast.AST) -> list[str] | None:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        base = _chain(node.value)
        return base + [node.attr] if base is not None else None
    return None


def _lookup(frame: Any, name: str) -> Any:
    if name in frame.f_locals:
        return frame.f_locals[name]
    if name in frame.f_globals:
        return frame.f_globals[name]
    return frame.f_builtins.get(name) if isinstance(frame.f_builtins, dict) else None


def _tensors(v: Any) -> list[torch.Tensor] | None:
    if type(v) in (list, tuple) and v and all(isinstance(x, torch.Tensor) for x in v):
        return list(v)
    return None


def _shown(t: Any) -> str:
    if isinstance(t, torch.Tensor):
        return dtype_str(t.dtype)
    items = _tensors(t)
    return f"a list of {dtype_str(items[0].dtype)} tensors" if items else type(t).__name__


def bound_at(frame: Any, name: str, lineno: int, t: Any) -> str | None:
    """The program's last line before ``lineno`` in the same function that binds ``name``, said with what made
    its dtype (``torch.from_numpy``, a ``.float()`` cast in an arithmetic), or None."""
    code = frame.f_code
    file = code.co_filename
    start = code.co_firstlineno if code.co_name != "<module>" else 1
    for n in range(lineno - 1, start - 1, -1):
        raw = linecache.getline(file, n)
        body = raw.strip()
        if not re.search(rf"\b{re.escape(name)}\b[^=]*=(?!=)", body):
            continue
        try:
            tree = ast.parse(body)
        except SyntaxError:
            continue
        stmt = tree.body[0] if tree.body else None
        if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or stmt.value is None:
            continue
        value: Any = None
        for target in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]):
            if isinstance(target, ast.Name) and target.id == name:
                value = stmt.value
            elif isinstance(target, ast.Tuple) and isinstance(stmt.value, ast.Tuple) and \
                    len(target.elts) == len(stmt.value.elts):
                value = next((v for e, v in zip(target.elts, stmt.value.elts)
                              if isinstance(e, ast.Name) and e.id == name), value)
        if value is None:
            continue
        body = ast.unparse(value) if value is not stmt.value else body
        at = f"{os.path.basename(file)}:{n}"
        calls = [c for c in ast.walk(value) if isinstance(c, ast.Call)]
        chains = [".".join(ch) for c in calls if (ch := _chain(c.func)) is not None]
        shown = _shown(t)
        if "torch.from_numpy" in chains or "from_numpy" in chains:
            return f"{name} made by `torch.from_numpy` at {at} (`{body}`): numpy's {shown} data keeps its dtype"
        casts = [ast.unparse(c) for c in calls if isinstance(c.func, ast.Attribute) and not c.args
                 and c.func.attr in ("float", "double", "half", "bfloat16")]
        if isinstance(value, ast.BinOp) and casts:
            return f"{name} made {shown} by `{ast.unparse(value)}` at {at}: `{casts[0]}` promotes the result" + \
                _uncast(value, frame)
        return f"{name} ({shown}) made at {at} (`{body}`)"
    return None


def _uncast(value: ast.BinOp, frame: Any) -> str:
    """`` (`ids * keep` keeps the integer dtype: a bool mask does not promote it)`` where the cast's receiver is a
    bool tensor and the other operand a name; else ``""``."""
    for side, other in ((value.right, value.left), (value.left, value.right)):
        if isinstance(side, ast.Call) and isinstance(side.func, ast.Attribute) and not side.args and \
                isinstance(side.func.value, ast.Name) and isinstance(other, ast.Name):
            mask = _lookup(frame, side.func.value.id)
            if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
                plain = ast.unparse(ast.BinOp(left=value.left if side is value.right else side.func.value, op=value.op,
                                              right=side.func.value if side is value.right else value.right))
                return f" (`{plain}` keeps the integer dtype of `{other.id}`: a bool mask does not promote it)"
    return ""
