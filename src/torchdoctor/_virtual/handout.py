"""A module the program keeps where it is, with its inputs: what it returns is moved where the program calls it.

A text encoder built and left on the cpu (``te = TextEncoder()``, to save the GPU's memory), given ids the program
makes on the cpu too, runs clean there; the failing op is the model's, given the encoder's output. Moving the encoder
where it is built (``apart``'s fix) would make its own first layer fail next (the ids stay on the cpu), which the
check at its layers' entries finds (``entrycheck``). The fix is then the encoder's output moved at the line that
calls it (``emb = te(ids).to(device)``), as a diff: the encoder and its inputs stay where the program keeps them, and
the failing op gets the operand the move fix would have given it (the same tensors, by the same names), so it is
proven as that fix was at the failing op.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import torch

from torchdoctor._virtual.prove import Fix

_CALLED = re.compile(r"called at (\S+:\d+)\)")


def output_fix(f: Fix, layer: str, wrong: str) -> Fix | None:
    """``f`` (a move of a module held apart to a device, ``te.to(device)``) written as a move of what the module
    returns at the program's line that calls it; None when that line is not the program's or calls it other than
    once by that name."""
    from torchdoctor._placement import device_str
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.devexpr import device_name
    from torchdoctor._virtual.origin import LINES
    from torchdoctor._virtual.ownline import own_line

    target = f.target
    hit = _CALLED.search(f.code)
    name = f.code.split(".to(", 1)[0] if f.kind == "apart" else ""
    if not isinstance(target, torch.device) or hit is None or not name or hit.group(1) not in LINES:
        return None
    file, line = LINES[hit.group(1)]
    read = own_line(file, line)
    if read is None or not read[1].isascii():
        return None
    raw, body, tree = read
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == name]
    if len(calls) != 1 or calls[0].end_col_offset is None:
        return None
    dev = device_name(file, line) or repr(device_str(target))
    cut = len(raw) - len(body) + int(calls[0].end_col_offset)
    new = raw[:cut] + f".to({dev})" + raw[cut:]
    diff = line_patch(file, line, new)
    if diff is None:
        return None
    code = (f"{new.strip()}  # {name} and what it is given stay where the program keeps them (moved alone, its "
            f"{layer} would be given a tensor {wrong}): move what it returns to {device_str(target)} where it is called")
    out = Fix(code, "note", target, sets=f.sets, diff=diff)
    out.at_op, out.proven = True, True
    out.tried = f.tried.split("; but ", 1)[0]
    return out


def hand_out(fixes: list[Fix], f: Fix, layer: str, wrong: str) -> bool:
    """``f`` replaced in ``fixes`` by the move of its module's output (``output_fix``); False when there is none."""
    alt = output_fix(f, layer, wrong)
    at = next((i for i, x in enumerate(fixes) if x is f), None)
    if alt is None or at is None or any(x.code == alt.code for x in fixes):
        return False
    fixes[at] = alt
    return True


__all__ = ["hand_out", "output_fix"]
