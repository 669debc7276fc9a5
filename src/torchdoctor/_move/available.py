"""``move`` to a device this machine does not have: refused before anything moves, with what to do instead.

Without this, ``move(pipe, "cuda:1")`` on a CPU-only torch fails inside the first tensor's ``.to`` with torch's
"Torch not compiled with CUDA enabled" (an ``AssertionError``), after the plan, and says nothing about what to use.
The check asks torch's own availability functions, which a virtual-device run answers for the hardware it
simulates, so ``move(model, "cuda:1")`` inside ``virtual_devices("cuda:1")`` is not refused. Only a refusal reads
the environment facts, for the reason in the user's words ("CPU-only build of torch 2.13.0+cpu").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchdoctor._placement import device_str
from torchdoctor._report.model import PlacementError
from torchdoctor._report.text import format_error

__all__ = ["missing", "refuse_missing"]

_VIRTUAL_TYPES = ("cuda", "xpu", "mps")  # what virtual_devices and simulate can stand in for


def _count(kind: str) -> Callable[[], int] | None:
    """The device count function of a backend torch has, or None when this torch has no such backend module."""
    mod: Any = torch.backends.mps if kind == "mps" else getattr(torch, kind, None)
    avail = getattr(mod, "is_available", None)
    if not callable(avail):
        return None
    count = getattr(mod, "device_count", None)

    def n() -> int:
        if not avail():
            return 0
        return int(count()) if callable(count) else 1

    return n


def missing(dev: torch.device) -> str | None:
    """Why ``dev`` is not on this machine (or the virtual one a run simulates), or None when it is there or when
    torch has no way to ask (a backend torchdoctor does not know: torch's own error is the answer then)."""
    n = _count(dev.type)
    if n is None:
        return None
    try:
        have = n()
    except Exception as exc:  # a backend whose probe itself fails is not usable either
        return f"torch.{dev.type} fails to answer: {type(exc).__name__}: {str(exc)[:120]}"
    index = dev.index or 0
    if index < have:
        return None
    if have:
        span = f"{dev.type}:0" if have == 1 else f"{dev.type}:0..{dev.type}:{have - 1}"
        return f"{device_str(dev)} does not exist: {have} {dev.type} device(s) visible ({span})"
    return _reason(dev) or f"torch sees no {dev.type} device"


def _reason(dev: torch.device) -> str | None:
    """The environment's reason (a CPU-only build, a hidden GPU, a driver missing), from the device facts."""
    try:
        from torchdoctor._env import devices
        from torchdoctor._env.facts import device_facts

        facts = device_facts()
        here = devices.virtual_view()  # a virtual run lays its hardware over the machine's
        if here:
            facts = {**facts, **here.get("facts", {})}
        return devices.unavailable_reason(facts, device_str(dev))
    except Exception:  # the reason is a courtesy: the refusal stands without it
        return None


def _here() -> str:
    try:
        from torchdoctor._env.devices import pick_device

        return f": {device_str(pick_device())}"
    except Exception:  # TORCHDOCTOR_DEVICE may name a missing device too: the fix line stands without the name
        return ""


def refuse_missing(dev: torch.device) -> None:
    """Raise ``PlacementError`` when ``dev`` is not available here; nothing has been touched yet."""
    why = missing(dev)
    if why is None:
        return
    name = device_str(dev)
    fix = f"torchdoctor.move(obj, torchdoctor.pick_device())  # the best device this machine has{_here()}"
    if dev.type in _VIRTUAL_TYPES:
        fix += (f"\n# or try {name} without the hardware, on virtual devices:\n"
                f"with torchdoctor.virtual_devices({name!r}):\n"
                f"    torchdoctor.move(obj, {name!r})\n"
                f"torchdoctor.simulate(obj, inputs, device={name!r})  # would the model run on {name}?")
    head = f"move refused, nothing was moved: {name} is not available here ({why})"
    raise PlacementError(format_error(head, [], fix), fix=fix)
