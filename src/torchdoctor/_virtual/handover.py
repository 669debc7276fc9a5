"""A module the program keeps on another device on purpose (a text encoder put on the cpu to save memory:
``te = TextEncoder().to(te_device)`` with ``--text_encoder_cpu``), whose output the program casts where it hands it
to the model (``dit(latents, context.to(dit_dtype))``): the fix is that cast given the model's device too
(``context.to(device, dit_dtype)``), a diff, never a move of the module the program placed (which would undo its
choice, and a move before the program's own ``.to`` on the line that builds it changes nothing).

Found from the fixes of a virtual run (a module held apart, moved back by ``apart``'s fix, whose line put it there
``modcast._put_apart``) and the failing ops: an operand on the module's device, made from its tensors, whose last
step was a cast at the program's own line. Proven at those ops with the operand moved there (its ``cast at`` tag).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from typing import Any

import torch

from torchdoctor._virtual.prove import Fix

__all__ = ["handed_fixes"]


def handed_fixes(items: list[Fix], cases: Sequence[Any]) -> list[Fix]:
    """``items`` with each move of a module the program put elsewhere on purpose replaced by the casts at the
    program's lines that hand its output on (module doc); the others as they were."""
    out: list[Fix] = []
    for f in items:
        wants = [f.target, *(t for _, t in f.sets)]
        target = next((t for w in wants for t in (w if isinstance(w, tuple) else (w,)) if isinstance(t, torch.device)),
                      None)
        placed = re.search(r"; put on (\S+) by (`[^`]*` at \S+):|  # moved to (\S+) in place at (\S+:\d+):", f.code)
        at_casts = _handed(f, target, cases, placed) if f.kind in ("apart", "path") and placed and target else []
        out.extend(at_casts or [f])
    return out


def _handed(f: Fix, target: torch.device, cases: Sequence[Any], placed: Any) -> list[Fix]:
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._virtual.castsites import SITES
    from torchdoctor._virtual.feeder import operands
    from torchdoctor._virtual.origin import LINES

    names = {n for n, _ in f.sets}
    lines: list[str] = []
    for c in cases:
        for o in operands(c.before):
            if str(o.device) == str(target) or not names & set(o.far):
                continue
            at = next((t[8:] for t in o.tags if t.startswith("cast at ") and t not in o.far), None)
            if at is not None and at not in LINES and (site := SITES.get(at)) is not None:
                LINES[at] = (site.file, site.lineno)  # the cast's line, as its site recorded it
            if at is not None and at in LINES and own_file(LINES[at][0]) and at not in lines:
                lines.append(at)
    where, by = (placed.group(1), placed.group(2)) if placed.group(1) else (placed.group(3), _line_at(placed.group(4)))
    held = f.code.split(".to(", 1)[0] if f.kind == "apart" and ".to(" in f.code.split("  #", 1)[0] else ""
    said = f"{held + ' is kept' if held else 'a module kept'} on {where} by the program (put there by {by})"
    fixes = [fix for at in lines if (fix := _cast_fix(at, target, said)) is not None]
    return fixes if len(fixes) == len(lines) else []


def _cast_fix(at: str, target: torch.device, said: str) -> Fix | None:
    """The cast at ``at`` (one ``.to(<dtype>)`` on the line) given ``target``'s device by the program's name."""
    from torchdoctor._placement import device_str
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.devvars import named_device
    from torchdoctor._virtual.origin import LINES
    from torchdoctor._virtual.ownline import own_line

    read = own_line(*LINES[at])
    if read is None or not read[1].isascii():
        return None
    raw, body, tree = read
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and
             n.func.attr == "to" and len(n.args) == 1 and not n.keywords]
    if len(calls) != 1 or calls[0].args[0].col_offset is None:
        return None
    dev = named_device(at, target) or repr(device_str(target))
    cut = len(raw) - len(body) + calls[0].args[0].col_offset
    new = raw[:cut] + f"{dev}, " + raw[cut:]
    diff = line_patch(*LINES[at], new)
    if diff is None:
        return None
    return Fix(f"{new.strip()}  # {said}: what it returns is handed on to {device_str(target)} here; move it with "
               "the cast", "note", target, sets=((f"cast at {at}", target),), diff=diff)


def _line_at(at: str) -> str:
    """```te = ....to(te_device)`` at app.py:5``: the program's line at ``at`` as written, else ``the line at ...``."""
    import linecache

    from torchdoctor._virtual.origin import LINES

    text = linecache.getline(*LINES[at]).strip() if at in LINES else ""
    return f"`{text.split('  #', 1)[0]}` at {at}" if text else f"the line at {at}"
