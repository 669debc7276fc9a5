"""Float8 operands an op a GPU has no float8 kernel of meets, cast to float8 by the program's own ``.to(...)`` with a
dtype it takes from a name: ``up.to(w.device, computation_dtype)`` in ``merge_lora_to_weight``, whose caller passes
``computation_dtype=weight.dtype`` — a float8-stored weight's dtype used as the compute dtype (a LoRA merged into an
fp8 checkpoint). The fix is where that dtype is chosen: the caller's argument (or the one-line assignment) written to
compute in bfloat16 when the dtype read is a one-byte storage dtype (a diff), judged at the failing op with the
operands that name cast so. Float8 stays what the program stores; the activations are never cast to it."""

from __future__ import annotations

import ast
import os
from collections.abc import Sequence
from typing import Any

import torch

from torchdoctor._virtual.ownline import source
from torchdoctor._report.model import Problem
from torchdoctor._virtual.prove import Fix

__all__ = ["chosen", "f8_dtype_fix", "function_at"]

_COMPUTE = torch.bfloat16


def f8_dtype_fix(p: Problem, cases: Sequence[Any], op: str, device: str) -> Fix | None:
    """The fix of ``p`` where the dtype its op's line casts to is chosen; None when the line casts to no name, or the
    name's choice is not on a line of the program's own that can be rewritten."""
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.feeder import operands

    case = next((c for c in cases if c.op == p.op and c.line is not None and own_file(c.line[0])), None)
    if case is None:
        return None
    file, line = case.line
    tree, text = _parsed(file)
    if tree is None:
        return None
    lines = text.split("\n")
    names = _cast_names(tree, line)
    func = function_at(tree, line)
    hit = next((h for n in names if (h := chosen(tree, lines, func, n, line, file)) is not None), None)
    if hit is None:
        return None
    name, at_line, expr, how = hit
    raw = lines[at_line - 1]
    seg = raw[expr.col_offset:int(expr.end_col_offset or 0)]
    new_value = _computed(seg)
    new = raw[:expr.col_offset] + new_value + raw[int(expr.end_col_offset or 0):]
    diff = line_patch(file, at_line, new.strip())
    if diff is None:
        return None
    short, cast_text = os.path.basename(file), lines[line - 1].strip()
    tags = dict.fromkeys(o.tags[0] for c in cases if c.op == p.op and c.line == case.line
                         for o in operands(c.before) if o.tags and str(o.meta.dtype).endswith(p.found))
    return Fix(f"# {short}:{at_line} {how} `{seg}` ({p.found}, a storage dtype) as {name}, the dtype `{cast_text}` "
               f"at {case.at} casts the {op}'s operands to; {device} has no {op} kernel in {p.found}: compute in "
               f"bfloat16 when the dtype read is a one-byte storage dtype ({name}: {new_value}); float8 stays for "
               "what is stored", "note", _COMPUTE, sets=tuple((t, _COMPUTE) for t in tags), diff=diff)


def _computed(seg: str) -> str:
    """The value a compute dtype takes instead of ``seg``: bfloat16 for a float8 constant, else ``seg`` kept for
    what is no storage dtype."""
    if seg.replace(" ", "").startswith("torch.float8_"):
        return "torch.bfloat16"
    return f"torch.bfloat16 if {seg}.itemsize == 1 else {seg}"


def _parsed(file: str) -> tuple[ast.Module | None, str]:
    got = source(file)
    return got if got is not None else (None, "")


def _cast_names(tree: ast.Module, line: int) -> list[str]:
    """The names the ``.to(...)`` calls on ``line`` cast to (a positional dtype after a device, or ``dtype=``)."""
    out: list[str] = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "to" and \
                n.lineno <= line <= int(n.end_lineno or n.lineno):
            for a in [*n.args, *(k.value for k in n.keywords if k.arg == "dtype")]:
                if isinstance(a, ast.Name) and a.id not in out:
                    out.append(a.id)
    return out


_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


def function_at(tree: ast.Module, line: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    best = None
    for n in ast.walk(tree):
        if isinstance(n, _FUNCS) and n.lineno <= line <= int(n.end_lineno or 0) and (best is None or
                                                                                   n.lineno > best.lineno):
            best = n
    return best


def chosen(tree: ast.Module, lines: list[str], func: Any, name: str, line: int, file: str
            ) -> tuple[str, int, ast.expr, str] | None:
    """(name, line, the expression written there, how it is bound) for ``name`` as the function at ``line`` reads it:
    a one-line assignment before ``line``, else the argument the one call of that function passes for its
    parameter (a keyword or a position)."""
    if func is None:
        return None
    own = [n for n in ast.walk(func) if isinstance(n, ast.Assign) and n.lineno < line and n.lineno == n.end_lineno
           and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) and n.targets[0].id == name]
    if own:
        return _one_line(name, own[-1].lineno, own[-1].value, "assigns", lines)
    params = [a.arg for a in (*func.args.posonlyargs, *func.args.args)]
    if name not in params and name not in [a.arg for a in func.args.kwonlyargs]:
        return None
    callee = func.name
    if callee == "__init__":  # a class's constructor: called by the class's name
        callee = next((c.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and func in c.body), "")
    calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and (
        isinstance(c.func, ast.Name) and c.func.id == callee or
        isinstance(c.func, ast.Attribute) and c.func.attr == callee)]
    if len(calls) != 1:  # several callers: none of them alone chose it
        return None
    call = calls[0]
    arg = next((k.value for k in call.keywords if k.arg == name), None)
    if arg is None and name in params:
        index = params.index(name) - (1 if params[0] in ("self", "cls") and (
            isinstance(call.func, ast.Attribute) or callee != func.name) else 0)
        if 0 <= index < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[:index + 1]):
            arg = call.args[index]
    if arg is None:
        return None
    if isinstance(arg, ast.Name):  # passed on by name: where the caller bound it
        return chosen(tree, lines, function_at(tree, call.lineno), arg.id, call.lineno, file)
    return _one_line(name, arg.lineno, arg, f"passes {callee}()", lines)


def _one_line(name: str, at: int, value: ast.expr, how: str, lines: list[str]
              ) -> tuple[str, int, ast.expr, str] | None:
    if value.lineno != value.end_lineno or not lines[at - 1].isascii():
        return None
    return name, at, value, how
