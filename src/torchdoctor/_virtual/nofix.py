"""A virtual run's last resort, when no fix aimed at a culprit: a move of the whole model, printed only where it
changes something. A model whose tensors are all on the device already (a dtype cast the device refuses, a tensor
made in forward) gets what was found as a note, unproven and saying why: moving it there changes nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from torchdoctor._placement import device_str, same_device
from torchdoctor._report.model import Problem
from torchdoctor._virtual.prove import Fix

__all__ = ["whole_move"]

_SAID = 240  # characters of the problem's own message the note repeats


def whole_move(problems: Sequence[Problem], device: torch.device,
               have: Mapping[str, tuple[torch.dtype, torch.device]]) -> Fix:
    """``torchdoctor.move(model, device)``, unless every model tensor (``have``: path -> dtype, device after the
    run) is on ``device`` already: then a note naming the first problem, never the no-op move.

    >>> import torch
    >>> cpu = torch.device("cpu")
    >>> whole_move([], cpu, {"w": (torch.float32, torch.device("meta"))}).code
    "torchdoctor.move(model, 'cpu')"
    >>> whole_move([], cpu, {"w": (torch.float32, cpu)}).code.startswith("# no fix found")
    True
    """
    where = device_str(device)
    if not have or not all(same_device(dev, device) for _, dev in have.values()):
        return Fix(f"torchdoctor.move(model, {where!r})", "path", sets=(("*", device),))
    said = next((f"{p.path}: {p.message}" for p in problems if p.message), "")
    said = said if len(said) <= _SAID else said[:_SAID - 1] + "…"
    return Fix(f"# no fix found: the model is on {where} already, so a move of it changes nothing; change the "
               f"line that makes or casts the tensor named here{f' ({said})' if said else ''}", "note",
               tried=f"not re-run: no line that made it was recorded, and the model is on {where} already")
