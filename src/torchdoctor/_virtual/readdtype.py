"""A caller's argument made by a factory whose ``dtype=`` the program reads from somewhere (``torch.randn(...,
dtype=self.unet.weight.dtype)``, ``dtype=weight_dtype``), handed to a model that computes in another dtype: the
program chose the dtype there on purpose, and its other consumers (the unet the latents also go to) follow it. The
model is the odd one (a ControlNet loaded with ``torch_dtype=torch.float16`` into a float32 pipeline): it is cast to
the program's dtype, never the expression rewritten to a dtype written out (which breaks the other consumers and
drops the program's own choice). Proven at the failing ops as a cast of the model is.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torchdoctor._virtual.prove import Fix

__all__ = ["read_dtype_fix"]


def read_dtype_fix(label: str, target: Any, made_args: Mapping[str, tuple[str, str, str]] | None) -> Fix | None:
    """The fix of argument ``label`` made in another floating dtype than ``target`` by a factory of the program's
    line whose ``dtype=`` is an expression (module doc); None otherwise."""
    from torchdoctor._placement import parse_dtype
    from torchdoctor._virtual.origin import LINES
    from torchdoctor._virtual.ownline import own_line

    hit = (made_args or {}).get(label)
    if hit is None or not isinstance(target, torch.dtype) or not target.is_floating_point or \
            not hit[0].startswith("torch.") or hit[1] not in LINES:
        return None
    op, at, found = hit
    try:
        was = parse_dtype(found)
    except (ValueError, TypeError):
        return None
    if not was.is_floating_point or was == target:
        return None
    read = own_line(*LINES[at])
    if read is None:
        return None
    calls = [n for n in ast.walk(read[2]) if isinstance(n, ast.Call) and ast.unparse(n.func) in (op, op[6:])]
    expr = next((k.value for c in calls[:1] for k in c.keywords if k.arg == "dtype"), None) if len(calls) == 1 \
        else None
    if expr is None or _written_out(expr):
        return None
    from torchdoctor._placement import dtype_str
    from torchdoctor._virtual.prove import Fix

    return Fix(f"torchdoctor.move(model, torch.{dtype_str(was)})  # {op} at {at} makes {label} in "
               f"dtype={ast.unparse(expr)} ({dtype_str(was)}), the program's dtype there, and this model computes in "
               f"{dtype_str(target)}: the model is the odd one, cast it to the program's dtype (or load it so)",
               "path", was, sets=(("*", was),))


def _written_out(expr: ast.expr) -> bool:
    """``torch.float16`` or ``"float16"`` written out: a dtype the fix may change at the line."""
    return isinstance(expr, ast.Constant) or isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) \
        and expr.value.id == "torch"
