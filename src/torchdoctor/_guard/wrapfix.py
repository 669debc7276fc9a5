"""A cast whose result the same line goes on to combine (``w = self.weight.to(dt) * self.scale_weight``): changing
the cast's dtype changes nothing when the other operand (a float32 scale) promotes the product again (hunt U29).
The fix is the line's whole value cast, where it is assigned (``w = (...).to(x.dtype)``), proven by running the
forward again with that local cast where it is used (``remedy.prove_line``); when nothing proves, no patch is
offered. Also the failing forward's locals in a dtype the error names (explain mode: the operands are gone, its
frame still holds what it computed with)."""

from __future__ import annotations

import ast
import os
from collections.abc import Callable
from typing import Any

import torch


def whole_line(m: Any, target: torch.dtype, stack: Any, raw: str | None,
               prove: Callable[[str], str]) -> tuple[str, str | None, str] | None:
    """(the code, its diff, the proof) casting the value ``m``'s line ``raw`` (None: not the user's file) assigns
    to one local, proven by ``prove(local)``; None when the line is not such an assignment or the re-run still
    fails."""
    from torchdoctor._guard.useline import parsed_line
    from torchdoctor._report.diff import line_patch

    got = parsed_line(raw) if raw is not None else None
    stmt = got[0].body[0] if got is not None and got[0].body else None
    if got is None or raw is None or not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                                          and isinstance(stmt.targets[0], ast.Name)) \
            or stmt.value.end_col_offset is None:
        return None
    shift = got[1]
    name = stmt.targets[0].id
    frame = next((f for f in reversed(stack or []) if f.f_code.co_filename == m.file
                  and name in f.f_code.co_varnames), None)
    want = dtype_expr(frame, target) if frame is not None else None
    if want is None:
        from torchdoctor._guard.maps import value_code

        want = value_code(target)
    col, end = stmt.value.col_offset + shift, stmt.value.end_col_offset + shift
    value = raw[col:end]
    atom = isinstance(stmt.value, (ast.Call, ast.Name, ast.Attribute, ast.Subscript))
    new = raw[:col] + (value if atom else f"({value})") + f".to({want})" + raw[end:]
    proof = prove(name)
    if not proof.startswith("fix proven"):
        return None
    proof = proof.replace(f"`{m.op}` at", f"`{name}` cast where it is assigned at", 1)
    return f"{new.strip()}  # {os.path.basename(m.file)}:{m.line}", line_patch(m.file, m.line, new), proof


def locals_made(frame: Any, named: set[Any], ref: Any) -> list[tuple[str, torch.Tensor]]:
    """The failing forward's local tensors in a dtype the error names other than ``ref``: in explain mode the op's
    operands are gone, its frame still holds what it computed with (``w`` in ``x @ w.t()``)."""
    out = []
    for name, v in frame.f_locals.items():
        if isinstance(v, torch.Tensor) and name != "self" and v.is_floating_point() and v.dtype in named \
                and v.dtype != ref:
            out.append((f"`{name}` (a local of {frame.f_code.co_name})", v))
    return out[:4]


def dtype_expr(frame: Any, target: torch.dtype) -> str:
    """How the forward names ``target``: one of its own tensor arguments' dtype (``hidden_states.dtype``), else its
    module's parameters', else the dtype written out."""
    code = frame.f_code
    own = code.co_varnames[0] if code.co_argcount else "self"  # a forward's first argument: `self`, or `s`
    for n in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
        v = frame.f_locals.get(n)
        if n != own and isinstance(v, torch.Tensor) and v.dtype == target:
            return f"{n}.dtype"
    me = frame.f_locals.get(own)
    p = next(me.parameters(), None) if isinstance(me, torch.nn.Module) else None
    if p is not None and p.dtype == target:
        return f"next({own}.parameters()).dtype"
    from torchdoctor._guard.maps import value_code

    return value_code(target)
