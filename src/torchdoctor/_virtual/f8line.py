"""Float8 operands an op a GPU has no float8 kernel of meets at the program's line (``x = x * mask``): that line
written with its float8 operands cast to bfloat16 (a diff), judged at the failing op with those operands cast.
Float8 stays what the program stores; the activations are never cast to it."""

from __future__ import annotations

import ast
import linecache
from collections.abc import Sequence
from typing import Any

import torch

from torchdoctor._report.model import Problem
from torchdoctor._virtual.prove import Fix

_OPS: dict[str, type[ast.operator]] = {"mul": ast.Mult, "add": ast.Add, "sub": ast.Sub, "div": ast.Div,
                                       "matmul": ast.MatMult}
_COMPUTE = torch.bfloat16


def f8_line_fix(p: Problem, cases: Sequence[Any], op: str, device: str) -> Fix | None:
    """The fix of ``p`` at its op's line: each operand of the op's expression (``a * b``, ``torch.mul(a, b)``,
    ``a.mul(b)``) cast to bfloat16 there; None when the line is not the program's own or holds no such expression."""
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.feeder import operands

    case = next((c for c in cases if c.op == p.op and c.line is not None and own_file(c.line[0])), None)
    if case is None:
        return None
    file, line = case.line
    raw = linecache.getline(file, line).rstrip("\r\n")
    new = _cast_operands(raw, op)
    if new is None:
        return None
    tags = dict.fromkeys(o.tags[0] for c in cases if c.op == p.op and c.line == case.line
                         for o in operands(c.before) if o.tags and o.meta.dtype == _dtype(p.found))
    return Fix(f"{new.strip()}  # {case.at}: {p.found} is storage on {device} (no {op} kernel in it): the {op} "
               "computes in bfloat16; float8 stays for what is stored", "note",
               _COMPUTE, sets=tuple((t, _COMPUTE) for t in tags), diff=line_patch(file, line, new.strip()))


def _dtype(name: str) -> torch.dtype | None:
    got = getattr(torch, name, None)
    return got if isinstance(got, torch.dtype) else None


def _cast_operands(text: str, op: str) -> str | None:
    """``text`` with the operands of its first ``op`` expression written ``operand.to(torch.bfloat16)``."""
    body = text.lstrip()
    indent = text[:len(text) - len(body)]
    try:
        tree = ast.parse(body)
    except SyntaxError:
        return None
    kind = _OPS.get(op)
    found: list[ast.expr] = []
    for n in ast.walk(tree):
        if kind is not None and isinstance(n, (ast.BinOp, ast.AugAssign)) and isinstance(n.op, kind):
            found = [n.left, n.right] if isinstance(n, ast.BinOp) else [n.value]
            break
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == op:
            top = isinstance(n.func.value, ast.Name) and n.func.value.id == "torch"
            found = [*n.args[:2]] if top else [n.func.value, *n.args[:1]]
            break
    if not found or any(a.lineno != 1 or a.end_lineno != 1 or a.end_col_offset is None for a in found):
        return None
    out = body
    for a in sorted(found, key=lambda a: a.col_offset, reverse=True):
        if isinstance(a, ast.Constant):
            continue
        seg = ast.get_source_segment(body, a) or ""
        wrapped = seg if isinstance(a, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)) else f"({seg})"
        out = out[:a.col_offset] + f"{wrapped}.to(torch.bfloat16)" + out[a.end_col_offset:]
    return indent + out if out != body else None
