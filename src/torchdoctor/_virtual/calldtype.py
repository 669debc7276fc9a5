"""A model's argument handed in the wrong dtype at a program's line that already casts its siblings there
(``dit(latents.to(device), text.to(device, dtype=dit_dtype), t.to(device, dtype=dit_dtype))``): cast where that line
hands it on, in the program's own name for the dtype and the siblings' style (``latents.to(device,
dtype=dit_dtype)``) — never "pass input 0 as tensor.to(torch.bfloat16)" as a comment.

The line is the first of the program's own frames that called the model (``usesite``). The argument (a positional or
a keyword one) is written with the dtype the siblings are cast to: its own ``.to(...)`` gets it added, a plain
expression gets ``.to(dtype=<name>)``. Only when every sibling cast on that call names the same dtype expression;
otherwise the fixes stay as they were. Proven by a re-run that gives the call the argument so (``operandfix``).
"""

from __future__ import annotations

import ast
from typing import Any

import torch

from torchdoctor._virtual.prove import Fix

__all__ = ["cast_at_call"]


def cast_at_call(items: list[Fix], main: Any) -> list[Fix]:
    """``items`` with each fix that passes a model's argument cast replaced by its cast at the model's call line,
    when that line casts the argument's siblings (module doc)."""
    from torchdoctor._virtual.usesite import use_of

    cast = [f for f in items if f.kind == "input" and isinstance(f.target, torch.dtype) and
            f.label.startswith(("input ", "kwarg "))]
    use = use_of(main) if cast and isinstance(main, torch.nn.Module) else None
    if use is None:
        return items
    out = list(items)
    for f in cast:
        fix = _fix(use, f)
        if fix is not None:
            out[next(i for i, g in enumerate(out) if g is f)] = fix
    return out


def _arg(call: ast.Call, label: str) -> tuple[ast.expr, list[ast.expr]] | None:
    """The argument ``label`` names (``input 0 (latents)``, ``kwarg mask``) and its siblings; None when absent."""
    kind, _, rest = label.partition(" ")
    key = rest.split(" ", 1)[0]
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    values = [*call.args, *(k.value for k in call.keywords)]
    if kind == "input" and key.isdigit() and int(key) < len(call.args):
        mine: ast.expr = call.args[int(key)]
    elif kind == "kwarg" and (hit := [k.value for k in call.keywords if k.arg == key]):
        mine = hit[0]
    else:
        return None
    return mine, [v for v in values if v is not mine]


def _dtype_of(node: ast.expr) -> tuple[str, bool] | None:
    """(the dtype's text, whether given as ``dtype=``) of a sibling's ``x.to(..., dtype=E)`` / ``x.to(device, E)``."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "to"):
        return None
    kw = [k.value for k in node.keywords if k.arg == "dtype"]
    if kw:
        return ast.unparse(kw[0]), True
    if len(node.args) == 2 and not node.keywords:
        return ast.unparse(node.args[1]), False
    return None


def _written(body: str, mine: ast.expr, dtype: str, keyword: bool) -> str | None:
    """The argument's new text: its own ``.to(...)`` given the dtype as its siblings are, else ``.to(dtype=...)``."""
    text = body[mine.col_offset:mine.end_col_offset]
    if isinstance(mine, ast.Call) and isinstance(mine.func, ast.Attribute) and mine.func.attr == "to":
        if any(k.arg == "dtype" for k in mine.keywords) or len(mine.args) != 1 or mine.keywords:
            return None  # it names a dtype already, or a form not read
        head = body[mine.col_offset:mine.args[0].end_col_offset]
        return f"{head}, {'dtype=' if keyword else ''}{dtype})"
    if isinstance(mine, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
        return f"{text}.to(dtype={dtype})"
    return f"({text}).to(dtype={dtype})"


def _fix(use: Any, f: Fix) -> Fix | None:
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.ownline import own_line

    read = own_line(use.file, use.line)
    if read is None or not read[1].isascii():
        return None
    raw, body, tree = read
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == use.func]
    got = _arg(calls[0], f.label) if len(calls) == 1 else None
    if got is None:
        return None
    mine, siblings = got
    said = {d for d in map(_dtype_of, siblings) if d is not None}
    if len({d[0] for d in said}) != 1 or _dtype_of(mine) is not None:
        return None  # no sibling cast, or casts to different dtypes: the program's intent is not read
    dtype, keyword = next(iter(said))
    new_arg = _written(body, mine, dtype, keyword)
    if new_arg is None:
        return None
    pad = len(raw) - len(body)
    new = raw[:pad + mine.col_offset] + new_arg + raw[pad + int(mine.end_col_offset or 0):]
    diff = line_patch(use.file, use.line, new.strip())
    if diff is None:
        return None
    name = ast.unparse(mine.func.value) if isinstance(mine, ast.Call) and isinstance(mine.func, ast.Attribute) \
        else ast.unparse(mine)
    return Fix(f"# {f.label} is handed to {use.func} at {use.at} in another dtype than its siblings, which that line "
               f"casts to {dtype}: cast it there too ({new_arg})", "note", f.target, sets=((f.label, f.target),),
               diff=diff, reoperand=(use.file, use.line, name, None, f.target) if name.isidentifier() else None)
