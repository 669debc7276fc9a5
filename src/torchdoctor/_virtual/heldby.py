"""The program's own name for a real tensor that no module of the run holds: ``ema.weight``, not ``<top level>``.

A training loop's EMA copy made before the model's move (``ema = copy.deepcopy(model)``) never runs a forward, so
the run never names its tensors, and its ``lerp_`` on a CPU parameter was reported as "a tensor made in forward at
<top level>". When such a problem is recorded the program's frames are alive: the first of them (innermost first,
the program's own code only) whose locals hold a module with that very tensor as a parameter or buffer gives its
path, ``ema.weight``. Asked only when a problem is recorded, never per op.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

# frames of these trees are machinery, not the program (torch, installed libraries, torchdoctor itself)
_SKIP = ("site-packages", "dist-packages", "/torch/", "/torchdoctor/", "<frozen")
_MAX_TENSORS = 20_000  # a holder bigger than this is not searched (the answer is a courtesy, never a cost)


def held_by(t: Any) -> str | None:
    """``holder.path`` of the real tensor a lifted operand came from (``_td_real``), or of the virtual tensor ``t``
    itself, or None."""
    real = getattr(t, "_td_real", None)
    if real is None:  # a virtual tensor itself (a parameter of a copy no forward ran)
        real = t
    frame = sys._getframe(1)
    while frame is not None:
        file = frame.f_code.co_filename
        if not any(s in file for s in _SKIP):
            hit = _in_locals(frame.f_locals, real)
            if hit is not None:
                return hit
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _in_locals(scope: dict[str, Any], real: torch.Tensor) -> str | None:
    for name, obj in list(scope.items()):
        if isinstance(obj, torch.nn.Module) and not name.startswith("__"):
            found = 0
            for rel, x in (*obj.named_parameters(remove_duplicate=False), *obj.named_buffers(remove_duplicate=False)):
                if x is real:
                    return f"{name}.{rel}"
                found += 1
                if found > _MAX_TENSORS:
                    break
    return None


# said of a held copy the program never moved: the fix moves its holder, never its in-place op's operands
NEVER_MOVED = "; the program never moved "


def never_moved(t: Any, path: str) -> str:
    """``; the program never moved ema`` when the holder of ``t`` named ``path`` (found as ``held_by`` finds it) is
    a module no move of the program's own code touched: an EMA copy made before the model's move. A holder the
    program moved (``self.module.to(device="cpu")``) is where the program keeps it: ''."""
    from torchdoctor._virtual.castlog import ACTIVE as _ACTIVE

    if not _ACTIVE:
        return ""
    holder, frame = None, sys._getframe(1)
    while frame is not None and holder is None:
        if not any(s in frame.f_code.co_filename for s in _SKIP):
            holder = next((m for name, m in list(frame.f_locals.items()) if isinstance(m, torch.nn.Module) and
                           not name.startswith("__") and path.startswith(name + ".")), None)
        frame = frame.f_back  # type: ignore[assignment]
    if holder is None:
        return ""
    mods = {id(m) for m in holder.modules()}
    moved = any((m := x[0]()) is not None and id(m) in mods for casts in list(_ACTIVE) for x in casts.moves)
    return "" if moved else NEVER_MOVED + path.split(".", 1)[0]
