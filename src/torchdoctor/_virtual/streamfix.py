"""In a model a device map spreads over devices (accelerate's ``dispatch_model``, ``device_map="auto"``), the
program's own line that adds a tensor it computed once to the stream the layers hand on (``hidden_states =
hidden_states + interpolated_mid_position_embeddings[i]``, a residual, a position embedding per layer): the tensor
computed once follows the stream, at that line — ``interpolated_mid_position_embeddings[i].to(hidden_states.device)``.

The hooks put each layer's output on the layer's own device and move it on to the next layer's: the stream is on
whichever device the last layer ran on, which the map decides. The tensor computed once (by a layer before the loop)
stays where its layer was put. Neither layer is moved by hand (``hooked``: the layer would meet its inputs
elsewhere); the line that mixes them is the place, as transformers' own fixes of such lines do.

The stream is the name the line's statement assigns and reads (``s = s + e``, ``s += e``, ``s = torch.add(s, e)``);
the other name, read plain or subscripted, whose tensor is on another device, is the one moved. Proven at the failing
op with that operand on the stream's device, and in a re-run (``operandfix``) where the line's torch calls — the
subscript included — are given it moved.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Any

import torch

from torchdoctor._virtual.prove import Fix

__all__ = ["stream_fix"]


def stream_fix(cases: Sequence[Any]) -> Fix | None:
    """The fix at the first failing op's line that adds a tensor on another device to the stream it assigns
    (module doc); None when no failing line has that shape."""
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._virtual.ownline import own_line

    for c in cases:
        names = getattr(c, "names", ())
        if c.line is None or len(names) < 2 or not own_file(c.line[0]):
            continue
        read = own_line(*c.line)
        if read is None or not read[1].isascii() or len(read[2].body) != 1:
            continue
        raw, body, tree = read
        stream = _assigned_and_read(tree.body[0])
        s = next((n for n in names if n.name == stream), None)
        if s is None:
            continue
        for e in names:
            if e.name == stream or e.device == s.device:
                continue
            spans = _reads(tree.body[0], e.name)
            if not spans:
                continue
            pad, new = len(raw) - len(body), raw
            for start, end in sorted(spans, reverse=True):  # from the right: offsets stay valid
                new = new[:pad + end] + f".to({stream}.device)" + new[pad + end:]
            fix = _fix(c, e, s, new.strip(), [new[pad + a:pad + b] for a, b in spans][:1])
            if fix is not None:
                return fix
    return None


def _assigned_and_read(stmt: ast.stmt) -> str | None:
    """The name a statement assigns and reads in its value (``s = s + e``, ``s += e``); None otherwise."""
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
        return stmt.target.id
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        name = stmt.targets[0].id
        if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(stmt.value)):
            return name
    return None


def _reads(stmt: ast.stmt, name: str) -> list[tuple[int, int]]:
    """Where the statement's value reads ``name`` as an operand, plain or subscripted (``e``, ``e[i]``): the spans
    a ``.to(...)`` goes after; empty when it reads it otherwise too (``e.shape``: a move there would change
    nothing, and the line is not the plain shape this fix knows)."""
    value = stmt.value if isinstance(stmt, (ast.Assign, ast.AugAssign)) else None
    if value is None:
        return []
    parents = {id(ch): n for n in ast.walk(value) for ch in ast.iter_child_nodes(n)}
    out = []
    for n in ast.walk(value):
        if not (isinstance(n, ast.Name) and n.id == name):
            continue
        up = parents.get(id(n))
        node: Any = up if isinstance(up, ast.Subscript) and up.value is n else n
        if isinstance(parents.get(id(node)), ast.Attribute):
            return []
        out.append((node.col_offset, node.end_col_offset))
    return out


def _fix(c: Any, e: Any, s: Any, new: str, shown: list[str]) -> Fix | None:
    from torchdoctor._report.diff import line_patch

    file, line = c.line
    diff = line_patch(file, line, new)
    if diff is None:
        return None
    paths = [t.removeprefix("far ") for t in e.tags if not t.startswith("operand ")]
    what = shown[0] if shown else e.name
    return Fix(f"# {what} (on {e.device}) meets {s.name} (on {s.device}) at {c.at or f'{file}:{line}'}: the device "
               f"map's hooks hand {s.name} on from layer to layer, {e.name} was computed once where its layer was put; "
               f"move it to the stream's device at that line ({what}.to({s.name}.device)), never a layer by hand",
               "note", s.device, sets=tuple((p, s.device) for p in dict.fromkeys(paths)) or ((e.name, s.device),),
               diff=diff, reoperand=(file, line, e.name, s.name, s.device))
