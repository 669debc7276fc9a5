"""A kernel that refuses an integer or bool operand (``"lerp_kernel_scalar" not implemented for 'Long'``: an EMA
that lerps every state-dict tensor, BatchNorm's int64 ``num_batches_tracked`` too): the program's own error, which
the op raises alike on every device, the CPU included. A virtual run records it as that error at the program's
line, the operand named (by its state-dict key or path), never as an op that cannot be simulated."""

from __future__ import annotations

import linecache
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from torchdoctor._report.model import Problem

_SCALAR = {"Long": torch.int64, "Int": torch.int32, "Short": torch.int16, "Char": torch.int8, "Byte": torch.uint8,
           "Bool": torch.bool}
_REFUSED = re.compile(r"\"(\w+)\" not implemented for '(\w+)'")


def _named(frame: Any, dtype: torch.dtype) -> list[str]:
    """The tensors of ``dtype`` the program's frame holds, by the name a state dict gives them (``1.num_batches_
    tracked``), else their path in the run, else the local's name."""
    names: list[str] = []

    def add(name: str | None, t: Any) -> None:
        if isinstance(t, torch.Tensor) and t.dtype == dtype and name and name not in names:
            names.append(name)

    for local, value in frame.f_locals.items():
        if isinstance(value, Mapping):
            for k, v in list(value.items())[:4096]:
                add(str(k), v)
        elif isinstance(value, (list, tuple)):
            for v in list(value)[:4096]:
                for t in (v if isinstance(v, (list, tuple)) else (v,)):
                    add(getattr(t, "_td_path", None), t)
        else:
            add(getattr(value, "_td_path", None) or local, value)
    return names


def refused_operand(exc: BaseException, first: str, paths: Mapping[int, str],
                    frame: Any) -> tuple[Problem, str, tuple[str, ...]] | None:
    """(the problem, why the run stopped, its sources) for a kernel's refusal of an integer/bool operand raised in
    the program's code (``frame``: the program's innermost frame it passed); None for any other error."""
    from torchdoctor._placement import dtype_str
    from torchdoctor._virtual.origin import LINES, short_at

    hit = _REFUSED.search(first)
    if not isinstance(exc, NotImplementedError) or hit is None or hit.group(2) not in _SCALAR:
        return None
    if frame is None:
        return None
    dtype, kernel = _SCALAR[hit.group(2)], hit.group(1)
    at = short_at(frame)
    LINES[at] = (frame.f_code.co_filename, frame.f_lineno)
    names = _named(frame, dtype)
    shown = ", ".join(names[:3]) + (" …" if len(names) > 3 else "")
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    op = (re.search(r"(torch\.[\w.]+|\.\w+_?)\(", line) or re.search("(.*)", kernel)).group(1)  # type: ignore[union-attr]
    module = frame.f_locals.get("self")
    mpath = paths.get(id(module)) if isinstance(module, nn.Module) else None
    mtype = type(module).__name__ if mpath is not None else None
    what = "bool" if dtype == torch.bool else "integer"
    message = (f"{op} at {at} reads {shown + ' ' if shown else 'a tensor '}({dtype_str(dtype)}): {type(exc).__name__}: "
               f"{first} — the kernel {kernel} takes no {what} tensors on any device (the CPU raises it too); "
               f"give it floating tensors only (if t.dtype.is_floating_point) and copy the others")
    problem = Problem("dtype", mpath or ("<root>" if mtype else "<top level>"), "activation", dtype_str(dtype),
                      "a floating dtype", message, op=op, module_path=mpath, module_type=mtype)
    return problem, f"the run ended at the program's own error at {at}: {type(exc).__name__}: {first}", ()


_MARK = "takes no integer tensors on any device"


def refusal_fixes(problems: Any, items: list[Any]) -> list[Any]:
    """A block whose only problems are such refusals: its fix is the program's line giving the op floating tensors
    only (advice: the line is the program's own logic), never a move or cast of the model."""
    from torchdoctor._virtual.prove import Fix

    refused = [p for p in problems if _MARK in p.message or _MARK.replace("integer", "bool") in p.message]
    if not refused or len(refused) < len(problems):
        return items
    at = refused[0].message.split(" reads ", 1)[0]
    return [Fix(f"# {at}: give the op floating tensors only and copy the others (for k, v in ...: "
                "e.lerp_(v, w) if v.dtype.is_floating_point else e.copy_(v)); no placement change is needed", "note",
                tried="advice: the line is the program's own logic, not re-run")]
