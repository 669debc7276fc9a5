"""A precision island: the program casts both operands of an op up on purpose (``scores = (q.float() @
k.float().transpose(-1, -2)) / ...``, the upcast attention of many diffusion and LLM codes) and the island's result
then meets the model's narrower data (``probs @ v`` with bfloat16 ``v``). Rewriting one of the island's casts mixes
its own operands (``q.to(torch.bfloat16) @ k.float()``: the patched program fails a line earlier) and rewriting both
removes the precision the program asked for. The fix is at the line where the island's result meets the data: the
result cast back to the data's dtype as the program names it (``probs.to(v.dtype) @ v``), a diff, proven at the
failing op on copies of its operands with the island's operand cast so."""

from __future__ import annotations

import linecache
import os
import re
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["island_fixes"]


def island_fixes(items: Sequence[Any], cases: Sequence[Any]) -> list[Any]:
    """``items`` with each cast-line fix that found its line casting more than one operand (no diff: ``castsites``)
    replaced by the cast back where the island's result meets the data (module doc); as they were otherwise."""
    out = list(items)
    for i, f in enumerate(out):
        if f.kind != "line" or f.site is None or not isinstance(f.target, torch.dtype):
            continue
        try:
            new = _met(f, cases) if f.diff is None else _cast_back(f, cases)
        except Exception:  # a diagnostic never breaks the report: the fix as it was
            new = None
        if new is not None:
            out[i] = new
    return out


def _cast_back(f: Any, cases: Sequence[Any]) -> Any:
    """``h = F.interpolate(h.float(), ...)``: the cast is an argument of the call the line computes in float32 on
    purpose, and the line assigns the name it cast: its value cast back to that name's dtype as it was (``h =
    F.interpolate(h.float(), ...).to(h.dtype)``), a diff proven at the failing op; None for any other line."""
    import ast

    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.feeder import operands
    from torchdoctor._virtual.prove import Fix

    raw = linecache.getline(f.site.file, f.site.lineno).rstrip("\r\n")
    try:
        stmt = ast.parse(raw.strip()).body[0]
    except (SyntaxError, IndexError):
        return None
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name) or \
            not isinstance(stmt.value, ast.Call):
        return None
    name = stmt.targets[0].id
    casts = [n for n in ast.walk(stmt.value) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and
             n.func.attr in ("float", "double", "to") and isinstance(n.func.value, ast.Name) and
             n.func.value.id == name]
    if len(casts) != 1 or casts[0] is stmt.value or ast.unparse(stmt.value.func).startswith("self."):
        return None  # the line is the cast itself (``h = h.float()``), or it feeds a layer (``self.fc1(h.float())``,
        # which fails on it before any cast back): its own fix stands
    value = raw.strip()[stmt.value.col_offset:stmt.value.end_col_offset]
    new = f"{name} = {value}.to({name}.dtype)"
    diff = line_patch(f.site.file, f.site.lineno, new)
    if diff is None:
        return None
    tag = f"cast at {f.site.at}"
    key = f"island {name} at {f.site.at}"
    hit = False
    for c in cases:
        if c.line == (f.site.file, f.site.lineno):
            return None  # an op of the cast's own line failed: no cast after it reaches that op
        for o in operands(c.before):
            if (tag in o.tags or tag in o.far) and o.meta.dtype != f.target and key not in o.tags:
                o.tags, hit = (*o.tags, key), True
    if not hit:
        return None
    code = (f"{new}  # {f.site.at}: {ast.unparse(casts[0])} computes {ast.unparse(stmt.value.func)} in "
            f"{str(f.site.dtype)[6:]} on purpose: its result cast back to {name}'s dtype there, where it returns into "
            "the model's flow (rewriting the cast drops the precision the line is for)")
    return Fix(code, "note", f.target, sets=((key, f.target),), diff=diff)


def _met(f: Any, cases: Sequence[Any]) -> Any:
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.prove import Fix

    tag = f"cast at {f.site.at}"
    for c in cases:
        if c.line is None or not own_file(c.line[0]):
            continue
        wide = [n for n in c.names if n.dtype is not None and n.dtype != f.target and
                any(t.endswith(tag) for t in n.tags)]
        data = [n for n in c.names if n.dtype == f.target]
        if len(wide) != 1 or not data:
            continue
        w, d = wide[0].name, data[0].name
        raw = linecache.getline(c.line[0], c.line[1]).rstrip("\r\n")
        new = _operand_cast(raw, w, f".to({d}.dtype)")
        if new == raw:
            continue
        diff = line_patch(c.line[0], c.line[1], new.strip())
        if diff is None:
            continue
        at = f"{os.path.basename(c.line[0])}:{c.line[1]}"
        key = f"island {w} at {at}"  # the wide operand's twin, read at the very line the fix changes: named so
        from torchdoctor._virtual.feeder import operands

        for o in operands(c.before):
            if o.meta.dtype == wide[0].dtype and (tag in o.tags or tag in o.far) and key not in o.tags:
                o.tags = (*o.tags, key)
        code = (f"{new.strip()}  # {at}: {w} is {str(wide[0].dtype)[6:]} from {f.site.at}, which casts both operands "
                f"up on purpose: cast its result back to {d}'s dtype where it meets {d} (rewriting one cast there "
                "mixes its operands)")
        return Fix(code, "note", f.target, sets=((key, f.target),), diff=diff,
                   reoperand=(c.line[0], c.line[1], w, None, f.target))
    return None


def autocast_off_fixes(items: Sequence[Any], cases: Sequence[Any]) -> list[Any]:
    """``items`` with comment-only dtype advice replaced by the cast of the operand where a block the program runs
    with autocast off reads it (``logits = self.router(h.float())`` under ``torch.autocast(..., enabled=False)``):
    the block computes in its layers' own dtype while ``h`` comes from the autocast region around it. A router or a
    loss kept in float32 this way is the program's choice; the data entering it is cast there, a diff, proven at the
    failing op. As they were when no failing op is at such a line."""
    if not any(f.code.startswith("#") and f.diff is None for f in items):
        return list(items)
    for c in cases:
        try:
            fix = _off_block(c)
        except Exception:  # a diagnostic never breaks the report: the fixes as they were
            fix = None
        if fix is not None:
            return [fix, *(f for f in items if not (f.code.startswith("#") and f.diff is None))]
    return list(items)


def _off_block(c: Any) -> Any:
    import ast

    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.devexpr import tree_of
    from torchdoctor._virtual.feeder import operands
    from torchdoctor._virtual.prove import Fix

    if c.line is None or not own_file(c.line[0]):
        return None
    file, line = c.line
    tree = tree_of(file)
    off = next((w for w in ast.walk(tree) if isinstance(w, ast.With) and w.lineno < line <= (w.end_lineno or 0) and
                any(_autocast_off(i.context_expr) for i in w.items)), None) if tree is not None else None
    if off is None:
        return None
    ops = [o for o in operands(c.before) if o.meta.is_floating_point()]
    kinds = [o.meta.dtype for o in ops]
    if len(set(kinds)) != 2:
        return None
    want = max(set(kinds), key=kinds.count)  # the block's layers' dtype: the most operands hold it
    odd = [n for n in c.names if n.dtype is not None and n.dtype != want and n.dtype.is_floating_point]
    if len(odd) != 1 or kinds.count(want) == kinds.count(odd[0].dtype):
        return None
    n = odd[0]
    cast = ".float()" if want == torch.float32 else f".to(torch.{str(want)[6:]})"
    raw = linecache.getline(file, line).rstrip("\r\n")
    new = _operand_cast(raw, n.name, cast)
    diff = line_patch(file, line, new.strip()) if new != raw else None
    if diff is None:
        return None
    at = f"{os.path.basename(file)}:{line}"
    key = f"island {n.name} at {at}"
    for o in ops:
        if o.meta.dtype == n.dtype and tuple(o.meta.shape) == tuple(n.shape) and key not in o.tags:
            o.tags = (*o.tags, key)
    code = (f"{new.strip()}  # {at}: autocast is off in this block ({os.path.basename(file)}:{off.lineno}), so it "
            f"computes in {str(want)[6:]} while {n.name} comes {str(n.dtype)[6:]} from the autocast region around it: "
            "cast it where the block reads it")
    return Fix(code, "note", want, sets=((key, want),), diff=diff, reoperand=(file, line, n.name, None, want))


def _autocast_off(node: Any) -> bool:
    """``torch.autocast(..., enabled=False)``, ``torch.cuda.amp.autocast(enabled=False)`` and the like."""
    import ast

    if not isinstance(node, ast.Call):
        return False
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    return name == "autocast" and any(k.arg == "enabled" and isinstance(k.value, ast.Constant) and
                                      k.value.value is False for k in node.keywords)


def _operand_cast(line: str, name: str, cast: str) -> str:
    """``line`` with its first read of ``name`` as an operand given ``cast`` (never an assignment to it, nor a read
    of its metadata: ``makers``' rule for an operand fixed at the program's call)."""
    from torchdoctor._virtual.makers import _NOT_READ

    return re.sub(rf"(?<![\w.]){re.escape(name)}\b(?!\s*=[^=]){_NOT_READ}", f"{name}{cast}", line, count=1)
