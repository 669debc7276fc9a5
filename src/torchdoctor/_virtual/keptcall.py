"""A layer the program keeps on another device on purpose inside its model, told by its own call: ``rows =
self.table(ids).to(device)`` moves the layer's output to the run's device the moment it returns, so the program
means the layer (a big embedding table kept on the cpu) to compute where it is. When that layer then fails on the
input (``ids`` on the device), moving the layer to the device undoes the program's choice; the fix moves the input
to the layer where the line hands it over (``self.table(ids.to(next(self.table.parameters()).device)).to(device)``),
a diff, proven at the failing op on the input's twin."""

from __future__ import annotations

import ast
import linecache
import os
import re
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["kept_call_fixes"]

_MOVES = frozenset({"to", "cuda", "xpu", "mps"})


def kept_call_fixes(items: Sequence[Any], cases: Sequence[Any]) -> list[Any]:
    """``items`` with the moves of such a layer's tensors replaced by the move of its input at the call (module
    doc); as they were otherwise."""
    out = list(items)
    for c in cases:
        try:
            hit = _kept(c)
        except Exception:  # a diagnostic never breaks the report: the fixes as they were
            hit = None
        if hit is None:
            continue
        prefix, fix = hit
        moved = [f for f in out if f.kind == "path" and f.sets and all(
            isinstance(n, str) and n.startswith(prefix) and isinstance(t, torch.device) for n, t in f.sets)]
        if moved:
            return [fix if f is moved[0] else f for f in out if f is moved[0] or f not in moved]
    return out


def _kept(c: Any) -> tuple[str, Any] | None:
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.feeder import operands
    from torchdoctor._virtual.prove import Fix

    if c.line is None or not own_file(c.line[0]):
        return None
    file, line = c.line
    raw = linecache.getline(file, line).rstrip("\r\n")
    try:
        tree = ast.parse(raw.strip())
    except SyntaxError:
        return None
    for n in ast.walk(tree):  # ``self.table(ids).to(device)``: a layer's call whose value is moved at once
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _MOVES and
                isinstance(n.func.value, ast.Call)):
            continue
        inner = n.func.value
        callee = ast.unparse(inner.func)
        if not callee.startswith("self.") or not inner.args or not isinstance(inner.args[0], ast.Name):
            continue
        arg = inner.args[0].id
        named = [x for x in c.names if x.name == arg]
        held = [o for o in operands(c.before) if o.named]  # the layer's own tensors at the failing op
        if len(named) != 1 or not held or len({o.device for o in held}) != 1 or held[0].device == named[0].device:
            continue
        path = callee.removeprefix("self.")
        prefix = next((t.rsplit(".", 1)[0] + "." for o in held for t in o.tags
                       if t.split(".")[-2:-1] == [path.split(".")[-1]]), None)
        if prefix is None:
            continue
        want = f"next({callee}.parameters()).device"
        body = raw.strip()
        new = body[:inner.args[0].col_offset] + f"{arg}.to({want})" + body[inner.args[0].end_col_offset or 0:]
        diff = line_patch(file, line, new)
        if diff is None:
            continue
        at = f"{os.path.basename(file)}:{line}"
        key = f"kept layer input {arg} at {at}"
        for o in operands(c.before):
            if not o.named and o.device == named[0].device and tuple(o.meta.shape) == named[0].shape:
                o.tags = (*o.tags, key)
        code = (f"{new}  # {at}: the line moves {callee}'s output to {ast.unparse(n.args[0]) if n.args else 'the device'}"
                f" as it returns, so {path} computes on {held[0].device} on purpose: {arg} moved to it there, never "
                f"{path} moved")
        return prefix, Fix(code, "note", held[0].device, sets=((key, held[0].device),), diff=diff)
    return None
