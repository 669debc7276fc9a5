"""The program's own names for a device where a factory ran: what a fix at that factory's line writes instead of a
device written out (``device=x.device``, ``device=next(self.parameters()).device``, ``device=device``). A literal
``'cuda:0'`` would break the program's own fallback on a machine without that accelerator."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["CPU_ARG", "DEVICE_NAMES", "device_name", "device_vars", "named_device"]

DEVICE_NAMES: dict[str, tuple[tuple[str, str], ...]] = {}  # "file:line" -> (name, device) of device variables there
CPU_ARG: set[tuple[str, int]] = set()  # (file, line) of a factory whose function's tensor named there was on the cpu


def device_name(f: Any, args: Any) -> str:
    """What a fix at a factory's line reads the device from (``x`` of ``device=x.device``): a tensor argument of its
    function on an accelerator now, at the factory's call (an argument still on the cpu there, moved a line later --
    ``h = h.to(self.lin.weight.device)`` -- would give the cpu); else the function's module's parameters
    (``next(self.parameters())``); else its first tensor argument; "" without one."""
    if not args:  # (a function's f_locals is a snapshot the frame keeps: read only where there are arguments)
        return ""
    loc = f.f_locals
    ts = [n for n in args if isinstance(loc.get(n), torch.Tensor)]
    on = next((n for n in ts if getattr(loc[n], "_td_device", loc[n].device).type != "cpu"), None)
    if on is not None:
        return on
    me = loc.get("self")
    p = next(me.parameters(), None) if isinstance(me, torch.nn.Module) else None
    if p is not None and getattr(p, "_td_device", p.device).type != "cpu" and ts:
        return "next(self.parameters())"
    if ts and len(CPU_ARG) < 4096:  # its device is no name for an accelerator's (``fixes.factory_fix``)
        CPU_ARG.add((f.f_code.co_filename, f.f_lineno))
    return ts[0] if ts else ""


def device_vars(f: Any) -> tuple[tuple[str, str], ...]:
    """(name, device) of each variable the factory's line can read that holds a device (``device =
    torch.device("cuda" if ... else "cpu")``, ``dev = "cuda"``): the program's own name for it, which a fix writes
    instead of a device written out (a literal would break the program's own fallback on another machine)."""
    out: list[tuple[str, str]] = []
    # a function's locals only where it has arguments: reading ``f_locals`` makes a snapshot the frame keeps, which
    # would hold what the function deletes later (``del model``) alive
    local = f.f_code.co_name == "<module>" or f.f_code.co_argcount > 0
    for scope in (f.f_locals, f.f_globals) if local and f.f_locals is not f.f_globals else (f.f_globals,):
        for n, v in list(scope.items())[:512]:
            if not n.startswith("_") and type(v).__name__ in _HOLDERS and all(m != f"{n}.device" for m, _ in out):
                try:  # accelerate's Accelerator / PartialState: the program's own ``accelerator.device``
                    out.append((f"{n}.device", str(torch.device(v.device))))
                except Exception:  # a holder without a usable device: no name from it
                    pass
                continue
            if n.startswith("_") or not ("dev" in n.lower() or isinstance(v, torch.device)):
                continue
            try:
                d = torch.device(v) if isinstance(v, (str, torch.device)) else None
            except (RuntimeError, TypeError, ValueError):
                d = None
            if d is not None and all(n != m for m, _ in out):
                out.append((n, str(d)))
    return tuple(out[:8])


_HOLDERS = frozenset({"Accelerator", "PartialState", "AcceleratorState"})  # objects whose .device is the program's


def named_device(at: str, t: Any) -> str | None:
    """The program's own variable holding device ``t`` where the factory at ``at`` runs (``device``), or None."""
    from torchdoctor._placement import norm_device

    if not isinstance(t, torch.device):
        return None
    want = norm_device(t)
    return next((n for n, d in DEVICE_NAMES.get(at, ()) if norm_device(torch.device(d)) == want), None)
