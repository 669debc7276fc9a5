"""Parameters ``Module.to`` replaced in a virtual run, and the optimizers that still hold the old ones.

On the real machine ``model.to("cuda")`` keeps each ``Parameter`` object (torch assigns ``param.data``), so an
optimizer, an EMA list or a hook built before the move goes on working. A virtual twin cannot be put inside a real
``Parameter`` (a wrapper's storage-less C++ tensor copied into a plain one crashes the interpreter, and the two
classes' layouts differ, so ``torch.utils.swap_tensors`` refuses them): ``Module._apply`` builds a new ``Parameter``
around the twin. The run records which one it replaced, and before every optimizer step the optimizer's groups and
state are pointed at the parameters the model now holds, as they would be on the device. Its state then meets the
step's checks beside the parameter it belongs to (a state loaded onto the CPU before the move is found there).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import torch

_APPLY = torch.nn.Module._apply.__code__


def note(space: Any, new: torch.Tensor) -> None:
    """``new`` is the ``Parameter`` that ``Module._apply`` (a frame or two up) builds in place of its ``param``."""
    if space is None:
        return
    frame = sys._getframe(1)
    for _ in range(3):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            return
        if frame.f_code is _APPLY:
            old = frame.f_locals.get("param")
            if isinstance(old, torch.nn.Parameter) and old is not new:
                space.replaced[id(old)] = (weakref.ref(old), weakref.ref(new))  # never keeps either alive
            return


def _now(space: Any, p: Any) -> Any:
    """What the model holds now in place of ``p`` (through several moves), or ``p`` itself."""
    for _ in range(16):
        hit = space.replaced.get(id(p))
        new = hit[1]() if hit is not None and hit[0]() is p else None
        if new is None:
            return p
        p = new
    return p


def retarget(space: Any, optimizer: Any) -> None:
    """Point ``optimizer``'s parameter groups and state at the parameters that replaced the ones it was built with."""
    if space is None or not space.replaced:
        return
    state = getattr(optimizer, "state", None)
    for group in getattr(optimizer, "param_groups", ()):
        params = group.get("params") if isinstance(group, dict) else None
        if not isinstance(params, list):
            continue
        for i, p in enumerate(params):
            new = _now(space, p)
            if new is p:
                continue
            params[i] = new
            if state is not None and p in state:
                state[new] = state.pop(p)
