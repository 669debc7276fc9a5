"""A factory of the program made its tensor in a dtype it was handed by name (``torch.zeros(..., dtype=dtype)`` in a
KV cache's ``__init__``), and that name was chosen elsewhere by a rule of the program's own — ``dtype = torch.bfloat16
if device.type == "cuda" else torch.float32`` in the caller (karpathy/nanochat PR #795): the fix is that choice,
written as the dtype the program cast its model with (``dtype = COMPUTE_DTYPE``, the name at the model's cast), never
a literal at the factory that breaks the program's other configurations. A diff of the choice's line; a re-run
(``simulate(call=)``, the marker) makes the factory's tensor so, the run proves it at the failing op or says why not."""

from __future__ import annotations

import ast
import os
import re
from typing import Any

import torch

from torchdoctor._virtual.ownline import source

__all__ = ["dtype_source_fix"]


def dtype_source_fix(f: Any, casts: Any, root: Any) -> Any:
    """``f`` (a factory's ``dtype=`` fix at its own line) replaced by the fix of the line that chose the dtype the
    factory was handed, written as the model's own dtype name; None when the factory is given no name, the name's
    choice is not the program's one-line rule, or the model's cast names no dtype there."""
    from torchdoctor._placement import dtype_str
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.f8dtype import chosen, function_at
    from torchdoctor._virtual.prove import Fix

    if f.remake is None or f.remake[3] is not None or not isinstance(f.remake[4], torch.dtype) or casts is None:
        return None
    file, line, _maker, _dev, want = f.remake
    tree, text = _parsed(file)
    if tree is None:
        return None
    lines = text.split("\n")
    name = next((k.value.id for c in ast.walk(tree) if isinstance(c, ast.Call) and c.lineno == line
                 for k in c.keywords if k.arg == "dtype" and isinstance(k.value, ast.Name)), None)
    hit = chosen(tree, lines, function_at(tree, line), name, line, file) if name else None
    if hit is None or hit[1] == line:
        return None
    bound, at_line, expr, how = hit
    model = _model_dtype(casts, root, want, file)
    if model is None:
        return None
    value, cast_at = model
    raw = lines[at_line - 1]
    seg = raw[expr.col_offset:int(expr.end_col_offset or 0)]
    if seg == value:
        return None
    diff = line_patch(file, at_line, (raw[:expr.col_offset] + value + raw[int(expr.end_col_offset or 0):]).strip())
    if diff is None:
        return None
    was = re.search(r"made it (?:on \S+ and )?in (\w+)", f.code)
    short = os.path.basename(file)
    return Fix(f"# {short}:{at_line} {how} `{seg}` as {bound}{f' ({was.group(1)} here)' if was else ''}, the dtype "
               f"{short}:{line} makes its tensor in (dtype={name}), while the model computes in {dtype_str(want)}, "
               f"cast with {value} at {cast_at}: make it the model's dtype ({bound}: {value}); a dtype written at the "
               "factory would break the program's other settings", "note", want, sets=f.sets, diff=diff,
               remake=f.remake)


def _parsed(file: str) -> tuple[ast.Module | None, str]:
    got = source(file)
    return got if got is not None else (None, "")


_NAMED = {"half": "torch.float16", "bfloat16": "torch.bfloat16", "float": "torch.float32"}


def _model_dtype(casts: Any, root: Any, want: torch.dtype, file: str) -> tuple[str, str] | None:
    """(the expression, ``file:line``) the program cast the model to ``want`` with: a module-level name of ``file``
    (``COMPUTE_DTYPE``), or a dtype written out (``torch.bfloat16``, ``.half()``)."""
    import linecache

    if not isinstance(root, torch.nn.Module):
        return None
    mods = {id(m) for m in root.modules()}
    for ref, dtype, cfile, cline, _at in reversed(casts.seen):
        m = ref()
        if m is None or dtype != want or id(m) not in mods and not any(x is root for x in m.modules()):
            continue
        try:
            tree = ast.parse(linecache.getline(cfile, cline).strip())
        except SyntaxError:
            continue
        for c in ast.walk(tree):
            if not isinstance(c, ast.Call) or not isinstance(c.func, ast.Attribute):
                continue
            if c.func.attr in _NAMED:
                return _NAMED[c.func.attr], f"{os.path.basename(cfile)}:{cline}"
            if c.func.attr != "to":
                continue
            for a in [*(k.value for k in c.keywords if k.arg == "dtype"), *c.args]:
                code = ast.unparse(a)
                if code == f"torch.{str(want).rsplit('.', 1)[-1]}":
                    return code, f"{os.path.basename(cfile)}:{cline}"
                if isinstance(a, ast.Name) and cfile == file and _module_level(file, a.id):
                    return a.id, f"{os.path.basename(cfile)}:{cline}"
    return None


def _module_level(file: str, name: str) -> bool:
    tree, _ = _parsed(file)
    return tree is not None and any(isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == name for t in n.targets) for n in tree.body)
