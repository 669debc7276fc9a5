"""A tensor the program takes back from a virtual device to the CPU at a line of its own, outside any forward: a CPU
master or EMA copy (``master = {n: p.detach().cpu() for n, p in model.named_parameters()}``), a state moved back by
hand (``qs.code = qs.code.cpu()``), a model moved for a save (``model.cpu().state_dict()``). The copy is a real CPU
tensor; its record (``TakenBack``) keeps the verb and the line, so when a forward on the device meets it the report
says which line put it on the CPU, and its last change is that line, not the model's earlier move.

Recorded by the runtime's move; read by the module-entry check (``entry``) when it finds such a copy among the
tensors a module computes with, and by ``torchdoctor run`` for the "last change" of a problem's tensor.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

from torchdoctor._virtual.origin import LINES, MACHINERY, Made, short_at


class TakenBack(Made):
    """``Made`` for a copy the program's line took to the CPU: ``verb`` as written (``.cpu()``, ``.to()``),
    ``by_module`` when a module's own move made it (``model.cpu()`` runs ``Module._apply``), ``time`` when;
    ``by_load``: torch's ``Optimizer.load_state_dict`` made it (each state tensor on its parameter's device then),
    ``before``: how many module moves each recording run had recorded by then (``modcast.counts``)."""

    __slots__ = ("verb", "by_module", "time", "by_load", "before")  # (``loaded`` is Made's: a torch.load record)

    def __init__(self, path: str | None, verb: str, at: str, by_module: bool, by_load: bool = False) -> None:
        super().__init__("Tensor.to", None, (path,) if path else ())
        self.at, self.moves = at, True
        self.verb, self.by_module, self.time, self.by_load = verb, by_module, time.time(), by_load
        self.before: tuple[tuple[Any, int], ...] = ()  # (set by the runtime's move, which may import modcast)

    def said(self, device: str, held: str | None = None) -> str:
        """`` (taken to cpu by `.cpu()` at app.py:7, held as master['w'])``, for a message."""
        return f" (taken to {device} by `{self.verb}` at {self.at}" + (f", held as {held})" if held else ")")

    def note(self, device: str) -> str:
        """What ``torchdoctor run`` says as the tensor's last change: ``on cpu since `.cpu()` at app.py:7``."""
        return f"on {device} since `{self.verb}` at {self.at}"


_TORCH = MACHINERY[1]  # torch's own files: a move called from them is a module's (``Module._apply``)
_OWN = MACHINERY[0]  # torchdoctor's


def made(path: str | None, verb: str) -> TakenBack | None:
    """The record of a copy taken back now, or None when the line that asked for it is not the program's own (a
    library's offload hook, a saver's ``.cpu()``: not where the program can change it)."""
    from torchdoctor._virtual.moveby import is_own

    f: Any = sys._getframe(2)
    caller = None  # the first frame outside torchdoctor: the program's, or torch's (a module's move)
    by_load = False
    while f is not None and f.f_code.co_filename.startswith(MACHINERY):
        if caller is None and not f.f_code.co_filename.startswith(_OWN):
            caller = f
        by_load = by_load or f.f_code is _LOAD
        f = f.f_back
    if f is None or not is_own(f.f_code.co_filename):
        return None
    at = short_at(f)
    LINES.setdefault(at, (f.f_code.co_filename, f.f_lineno))
    from torchdoctor._virtual.moveby import note_args
    note_args(f, at)  # its function's arguments: a fix may send it to one's device instead
    by_module = caller is not None and caller.f_code.co_filename.startswith(_TORCH) and _in_apply(caller)
    return TakenBack(path, verb, at, by_module, by_load)


_LOAD = torch.optim.Optimizer.load_state_dict.__code__


def _in_apply(f: Any) -> bool:
    """``f`` (a frame of torch's) runs inside ``Module._apply`` (``model.cpu()``, ``model.to('cpu')``)."""
    while f is not None and f.f_code.co_filename.startswith(_TORCH):
        if f.f_code.co_name == "_apply" and isinstance(f.f_locals.get("self"), torch.nn.Module):
            return True
        f = f.f_back
    return False


def of(t: Any) -> TakenBack | None:
    """The record of the real CPU tensor ``t`` if the program took it back at its own line in this run."""
    from torchdoctor._virtual.tensor import VirtualTensor, current_space

    if not isinstance(t, torch.Tensor) or isinstance(t, VirtualTensor):
        return None
    space = current_space()
    kept = space.real_record(t) if space is not None and space.real else None
    return kept[1] if kept is not None and isinstance(kept[1], TakenBack) else None
