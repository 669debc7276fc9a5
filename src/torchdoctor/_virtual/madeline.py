"""A tensor the program's own line made on the cpu by an op of its own (``mask = torch.arange(n)[None, :] <
torch.tensor(lens)[:, None]``, lengths taken to the host with ``.tolist()`` and a padding mask rebuilt from them),
then handed to an op on the accelerator: the line's result is moved where it is made, a diff, to the device the
line's function was given (``(...).to(x.device)``) or the program's own device variable, never a device written out
(which would break the program's own cpu fallback).

The line is one assignment whose value is that op (a comparison, an arithmetic operator or a call of that name);
the fix sets the operand the op's record names (``made Tensor.lt at app.py:12``, ``twins.tags_of``), so it is
proven at the failing op like a maker's fix.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import torch

from torchdoctor._virtual.prove import Fix

__all__ = ["MADE", "made_line_fix"]

MADE = "made "  # an operand's tag: ``made Tensor.lt at app.py:12``, the op and line of the program that made it

_OPERATORS = {"lt": ast.Lt, "gt": ast.Gt, "le": ast.LtE, "ge": ast.GtE, "eq": ast.Eq, "ne": ast.NotEq}
_BINARY = {"add": ast.Add, "sub": ast.Sub, "mul": ast.Mult, "div": ast.Div, "matmul": ast.MatMult,
           "bitwise_and": ast.BitAnd, "bitwise_or": ast.BitOr, "logical_and": ast.BitAnd, "logical_or": ast.BitOr,
           "floor_divide": ast.FloorDiv, "remainder": ast.Mod, "pow": ast.Pow}


def made_line_fix(label: str, target: Any) -> Fix | None:
    """The fix of ``the tensor made by Tensor.lt at app.py:12 (on cpu)`` (``meetsite.made_by``) at that line (module
    doc); None for a dtype, a library's line, or a line whose value is not that op."""
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.devvars import named_device
    from torchdoctor._virtual.origin import IN_SCOPE, LINES
    from torchdoctor._virtual.ownline import own_line

    hit = re.match(r"the tensor made by (\S+) at (\S+:\d+) \(on ", label)
    if hit is None or not isinstance(target, torch.device) or hit.group(2) not in LINES:
        return None
    op, at = hit.groups()
    read = own_line(*LINES[at])
    if read is None or not read[1].isascii() or len(read[2].body) != 1:
        return None
    raw, body, tree = read
    stmt = tree.body[0]
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1 or not _made_by(stmt.value, op):
        return None
    x = IN_SCOPE.get(at)
    want = f"{x}.device" if x else named_device(at, target)
    if want is None or stmt.value.end_col_offset is None:
        return None
    start, end = len(raw) - len(body) + stmt.value.col_offset, len(raw) - len(body) + stmt.value.end_col_offset
    value = raw[start:end]
    wrapped = f"{value}.to({want})" if isinstance(stmt.value, (ast.Call, ast.Name, ast.Attribute, ast.Subscript)) \
        else f"({value}).to({want})"
    new = raw[:start] + wrapped + raw[end:]
    diff = line_patch(*LINES[at], new)
    if diff is None:
        return None
    return Fix(f"{new.strip()}  # {op} at {at} made it on the cpu: moved where it is made",
               "note", target, sets=((f"{MADE}{op} at {at}", target),), diff=diff)


def _made_by(value: ast.expr, op: str) -> bool:
    """The expression's outermost operation is ``op`` (``Tensor.lt``: ``a < b``; ``torch.cat``: ``torch.cat(...)``)."""
    name = op.rsplit(".", 1)[-1].removeprefix("__").removesuffix("__")
    if isinstance(value, ast.Compare):
        return len(value.ops) == 1 and isinstance(value.ops[0], _OPERATORS.get(name, ()))
    if isinstance(value, ast.BinOp):
        return isinstance(value.op, _BINARY.get(name, ()))
    if isinstance(value, ast.Call):
        f = value.func
        return (f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else "") == name
    return False
