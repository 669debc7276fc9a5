"""A cast whose dtype is read from another tensor (``emb.to(t.dtype)``, ``x.type_as(t)``, ``x.to(t)``,
``x.to(device, dtype=t.dtype)``) only carries that tensor's dtype: the line that chose the dtype is whatever made
``t`` in it (``torch.from_numpy`` of numpy's float64 timesteps), never the helper that follows it. ``donor`` reads the
cast's line of the program and names that tensor as its frame holds it; the cast's record then goes through to the
donor's (``makers``), and a refused cast on a device that cannot hold the dtype is the donor's problem, already said.
"""

from __future__ import annotations

import ast
import functools
import linecache
from typing import Any

import torch

_CASTS = frozenset({"to", "type_as", "type"})


def donor(frame: Any, dtype: torch.dtype) -> torch.Tensor | None:
    """The tensor of ``dtype`` whose dtype the cast running at ``frame``'s line reads (``t`` of ``.to(t.dtype)``,
    ``.type_as(t)``, ``.to(t)``), as the frame holds it; None for a dtype written out (``.to(torch.bfloat16)``),
    read from an attribute or a config, or a line that holds no such cast."""
    if frame is None:
        return None
    text = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    if not any(f".{name}(" in text for name in _CASTS):
        return None
    for expr in _read(text):
        t = _value(expr, frame)
        if isinstance(t, torch.Tensor) and t.dtype == dtype:
            return t
    return None


@functools.lru_cache(maxsize=1024)
def _read(text: str) -> tuple[ast.expr, ...]:
    """The expressions the casts of a line may read their dtype from (``_dtype_args``), parsed once per line's text
    for the process (a forward runs its casts on every call); () for a statement over several lines."""
    try:
        tree: ast.AST = ast.parse(text + " pass" if text.endswith(":") else text)
    except SyntaxError:  # a statement over several lines: its dtype is not read here
        return ()
    return tuple(expr for node in ast.walk(tree)
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CASTS
                 for expr in _dtype_args(node))


def _dtype_args(call: ast.Call) -> list[ast.expr]:
    """The expressions a cast call may read its dtype from a tensor by: ``X.dtype`` anywhere in its arguments, and a
    bare tensor argument (``type_as(X)``, ``to(X)``)."""
    out: list[ast.expr] = []
    for arg in [*call.args, *(k.value for k in call.keywords if k.arg in ("dtype", "other", "tensor"))]:
        if isinstance(arg, ast.Attribute) and arg.attr == "dtype":
            out.append(arg.value)
        elif isinstance(arg, (ast.Name, ast.Attribute, ast.Subscript)):
            out.append(arg)
    return out


def _value(expr: ast.expr, frame: Any) -> Any:
    """The value of a plain name or attribute chain (``t``, ``self.freqs``) in ``frame``, read without calling
    anything the program wrote (no properties beyond plain attribute reads of tensors and modules); None else."""
    names: list[str] = []
    node: ast.expr = expr
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    scope = frame.f_locals
    obj = scope[node.id] if node.id in scope else frame.f_globals.get(node.id)
    for name in reversed(names):
        held = getattr(obj, "__dict__", None)
        if isinstance(obj, torch.nn.Module):
            obj = obj._parameters.get(name) if name in obj._parameters else obj._buffers.get(name) \
                if name in obj._buffers else held.get(name) if held is not None else None
        else:
            obj = held.get(name) if isinstance(held, dict) else None
        if obj is None:
            return None
    return obj
