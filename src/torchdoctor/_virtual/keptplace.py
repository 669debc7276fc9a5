"""A module the program built and placed in one line on another device than the run's (``te =
Qwen3Encoder().to(device)`` with a "run the text encoder on the cpu" toggle, ``vae = Encoder().to("cpu")`` by a "force
VAE device" node), then called with inputs the program sent to the run's device: the module is where the program
wants it, the inputs are what is wrong. The fix moves those inputs where the program's line hands them to the module
(``te(input_ids.to(device), ...)``, with the placing line's own device name when it is read in the same function,
else the module's device, ``next(self.net.parameters()).device``), a diff, never a move of the module (which would
undo the program's choice). A module moved away later (``model.cpu()`` to save, then used again) was on the device
before: its move back stays the fix.

Found from a whole-module move fix, the ``moved <path> at <line>`` tags of its tensors at the failing ops (one line
of the program, which builds the module and moves it), the module's last use (``usesite``) and the failing ops'
operands that are its inputs (``input 0 (input_ids)``). Proven at those ops with the inputs on the module's device.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torchdoctor._virtual.prove import Fix

__all__ = ["built_and_placed", "kept_fixes"]


def kept_fixes(items: list[Fix], main: Any, cases: Sequence[Any], given: dict[int, dict[str, str]]) -> list[Fix]:
    """``items`` with the move of a module the program built on another device on purpose replaced by the move of
    its inputs at the line that calls it (module doc); ``given``: the devices of the tensors each outermost module
    was last given, by the caller's label (``entry``)."""
    if not isinstance(main, torch.nn.Module) or not cases:
        return items
    out: list[Fix] = []
    for f in items:
        got = _inputs_moved(f, main, cases, given.get(id(main), {})) if f.kind == "path" and f.code.startswith("torchdoctor.move(") else None
        out.append(got or f)
    return out


def _inputs_moved(f: Fix, main: torch.nn.Module, cases: Sequence[Any], given: dict[str, str]) -> Fix | None:
    from torchdoctor._virtual.feeder import operands
    from torchdoctor._virtual.origin import LINES
    from torchdoctor._virtual.usesite import use_of

    names = {n for n, _ in f.sets}
    target = next((t for _, t in f.sets if isinstance(t, torch.device)), None)
    if not names or target is None:
        return None
    placed: set[str] = set()
    inputs: dict[str, Any] = {}  # "input 0 (input_ids)" -> its operand on the run's device
    here: set[str] = set()  # where the module's tensors were met
    for c in cases:
        ops = operands(c.before)
        for o in ops:
            if names & set(o.tags) and str(o.device) != str(target):  # (a failed op's output keeps its names)
                placed.update(t.rpartition(" at ")[2] for t in o.tags if t.startswith("moved "))
                here.add(str(o.device))
            label = next((t for t in o.tags if t.startswith(("input ", "kwarg "))), None)
            if label is not None and str(o.device) == str(target):
                inputs.setdefault(label, o)
    if len(placed) != 1 or not inputs or len(here) != 1:
        return None
    for label, dev in given.items():  # the others it was given there too (a mask its output meets later)
        if dev == str(target):
            inputs.setdefault(label, None)
    at = next(iter(placed))
    use = use_of(main)
    if at not in LINES or use is None:
        return None
    device = torch.device(next(iter(here)))
    name = built_and_placed(*LINES[at])
    if name is None:
        return None
    return _written(use, at, name, inputs, device)


def built_and_placed(file: str, line: int) -> str | None:
    """The device expression of line ``line`` when it builds a module and moves it in one statement (``te =
    Encoder().to(device)``: ``device``; ``.cpu()``: ``"cpu"``); None for any other line (a move of a module built
    before: it was elsewhere first)."""
    from torchdoctor._virtual.ownline import own_line

    read = own_line(file, line)
    if read is None or len(read[2].body) != 1 or not isinstance(read[2].body[0], ast.Assign):
        return None
    value = read[2].body[0].value
    if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Attribute) or \
            not isinstance(value.func.value, ast.Call):
        return None
    if value.func.attr == "cpu" and not value.args:
        return '"cpu"'
    if value.func.attr == "to" and len(value.args) == 1 and not value.keywords and \
            "offload" not in ast.unparse(value.args[0]).lower():  # parked on an offload device: loaded before use
        return ast.unparse(value.args[0])
    return None


def _written(use: Any, placed_at: str, name: str, inputs: dict[str, Any], device: torch.device) -> Fix | None:
    from torchdoctor._placement import device_str
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.devexpr import enclosing
    from torchdoctor._virtual.origin import LINES
    from torchdoctor._virtual.ownline import own_line
    from torchdoctor._virtual.prove import Fix

    read = own_line(use.file, use.line)
    if read is None or not read[1].isascii():
        return None
    raw, body, tree = read
    call = next((n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == use.func), None)
    if call is None:
        return None
    args: list[ast.expr] = []
    for label in inputs:
        hit = re.match(r"input (\d+)|kwarg (\w+)", label)
        if hit is None:
            return None
        if hit.group(1) is not None:
            i = int(hit.group(1))
            if i >= len(call.args) or isinstance(call.args[i], ast.Starred):
                return None
            args.append(call.args[i])
        else:
            kw = next((k.value for k in call.keywords if k.arg == hit.group(2)), None)
            if kw is None:
                return None
            args.append(kw)
    same = enclosing(*LINES[placed_at]) is enclosing(use.file, use.line)
    to = name if same and (name.isidentifier() or name.startswith(("'", '"'))) else \
        f"next({use.func}.parameters()).device"
    pad, new = len(raw) - len(body), raw
    for a in sorted(args, key=lambda a: a.col_offset, reverse=True):  # from the right: offsets stay valid
        if a.end_col_offset is None:
            return None
        start, end = pad + a.col_offset, pad + a.end_col_offset
        text = new[start:end]
        wrapped = text if isinstance(a, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)) else f"({text})"
        new = new[:start] + f"{wrapped}.to({to})" + new[end:]
    diff = line_patch(use.file, use.line, new)
    if diff is None:
        return None
    return Fix(f"{new.strip()}  # `{use.func}` is kept on {device_str(device)} by the program (built and placed "
               f"at {placed_at}): its inputs go there, where it is called; the module stays where it was put",
               "note", device, sets=tuple((label, device) for label in inputs), diff=diff)
