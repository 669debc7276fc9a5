"""Twins of a real tensor that carries a device label (a parameter an offload hook onloaded with ``p.data = ...``):
each op that reads it gets a fresh twin, and autograd keeps the twin an op saved for its backward (``native_layer_norm``
saves its weight itself, a convolution its kernel). On the device that saved tensor *is* the parameter, so when the
hook swaps the parameter's data back to the CPU after the block's forward, the backward reads it there. The twins
still alive follow each later ``.data =`` of their source; a view taken in the forward (a linear's ``weight.t()``) is
a twin of its own and keeps the old data, as on the device.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

_KEY = "_td_lifted"


def note(real: torch.Tensor, twin: Any) -> None:
    """``twin`` was lifted from the labelled ``real`` for one op."""
    kept = [r for r in real.__dict__.get(_KEY, ()) if r() is not None]
    kept.append(weakref.ref(twin))
    real.__dict__[_KEY] = kept


def follow(real: torch.Tensor, device: torch.device) -> None:
    """``real``'s data was swapped to ``device``: the twins lifted from it that are still held (saved for a
    backward) are there too."""
    refs = real.__dict__.pop(_KEY, ())
    if refs:
        swapped([r() for r in refs], device)


def swapped(twins: Any, device: torch.device) -> None:
    """Each of ``twins`` (``None`` skipped) is on ``device`` now, its data swapped there by the code running: that
    code (the first frame outside torch and torchdoctor) is kept on it, for the problem a later op meets it in."""
    mover: str | None = None
    for t in twins:
        if t is None or t._td_device == device:
            continue
        if mover is None:
            mover = _mover()
        t.__dict__["_td_swapped"] = (t._td_device, device, mover)
        t._td_device = device


def _mover() -> str:
    """``_offload_to_memory (diffusers/hooks/group_offloading.py:339)``: the function whose line swapped the data."""
    from torchdoctor._virtual.origin import short_at, user_frame

    from torchdoctor._guard.ownfile import own_file

    f = user_frame(3)
    if f is None:
        return "code outside the program"
    name = getattr(f.f_code, "co_qualname", f.f_code.co_name)
    if own_file(f.f_code.co_filename):
        return f"`{name}` at {short_at(f)}"
    return f"`{name}` of {f.f_globals.get('__name__', 'a library')} (line {f.f_lineno})"  # a library's hook


def swapped_odd(keys: Any, call: Any) -> tuple[list[Any], torch.device] | None:
    """Of an op's operands (``keys``): those whose data an offload swapped away after an op saved them, and the
    device they were saved on (where the op runs), when every other operand is there; else None."""
    odd, home = [], None
    for k in keys:
        hit = getattr(call.at(k), "__dict__", {}).get("_td_swapped")
        if hit is not None and call.at(k)._td_device == hit[1]:
            odd.append(k)
            home = hit[0]
    rest = [call.at(k) for k in keys if k not in odd]
    if home is None or any(getattr(t, "_td_device", home) != home for t in rest if t.dim() > 0):
        return None
    return odd, home


def said(t: Any) -> str | None:
    """How ``t`` came to be where an op meets it, when its data was swapped after an op saved it; else None."""
    hit = getattr(t, "__dict__", {}).get("_td_swapped")
    if hit is None:
        return None
    before, now, mover = hit
    return (f"an op saved it for the backward on {before}, and {mover} then moved its data to {now} in place "
            f"(the saved tensor is the parameter itself, so the backward reads it there)")


SOURCE = "swapped "  # a problem's source: ``swapped <path> by <mover>`` (``note_source``), fixed by ``swap_fix``


def note_source(t: Any, path: str | None) -> str:
    """The source a problem on ``t`` (whose data was swapped after an op saved it: ``said``) is fixed by."""
    hit = getattr(t, "__dict__", {}).get("_td_swapped") or (None, None, "code outside the program")
    frozen = _FROZEN if isinstance(t, torch.Tensor) and not t.requires_grad else ""
    return f"{SOURCE}{path or 'a tensor'} by {hit[2]}{frozen}"


_FROZEN = " [frozen]"  # the swapped parameter takes no gradient: the backward reads it to reach the trained ones


def swap_fix(source: str, found: str, expected: str) -> Any:
    """The fix of a parameter an offload moved away between the forward that saved it and the backward that reads
    it: never a move of the parameter (the offloading moves it again after every forward), but no offloading of what
    is trained (or the move after the backward); a frozen one (a LoRA's base layer) is still read by the backward
    that carries the gradient through it to the trained ones, so it is brought back before that backward. Not re-run,
    since the offloading is the program's or the library's own."""
    from torchdoctor._virtual.prove import Fix

    path, _, mover = source[len(SOURCE):].partition(" by ")
    frozen = mover.endswith(_FROZEN)
    mover = mover.removesuffix(_FROZEN)
    owner = path.rpartition(".")[0] or path  # one note per module: its weight and bias were moved together
    head = (f"# {owner}: {mover} moved its parameters to {found} after the forward that saved them for the "
            f"backward, which then reads them there on {expected}: ")
    if frozen:  # frozen, yet the gradient of what is trained before it flows back through this layer's weights
        return Fix(head + "they are frozen, but the backward reads them to carry the gradient through this layer "
                   f"to the trained ones before it: bring them back to {expected} before its backward (a "
                   "register_full_backward_pre_hook that moves the module in, as the forward pre-hook does), or "
                   "offload them only after the backward", "note",
                   tried="not re-run: the move is the offloading's own, made after each forward; the fix changes when "
                         "it moves, not a tensor")
    return Fix(head + f"do not offload modules that are trained (offload the frozen parts only, or keep the trained "
               f"ones on {expected}), or offload them after the backward", "note",
               tried="not re-run: the move is the offloading's own, made after each forward; the fix changes what "
                     "is offloaded, not a tensor")
