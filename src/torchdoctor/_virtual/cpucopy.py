"""The copy of the object a dtype check on the CPU (``simulate(..., device="cpu", dtype=...)``) runs, so the user's own
object is never touched."""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["copied"]


def copied(obj: Any) -> Any:
    """A deep copy of ``obj``. A tensor computed with autograd that the object holds (``torch.nn.utils.weight_norm``
    keeps ``weight`` so, remade from ``weight_g`` and ``weight_v`` before every call) refuses deepcopy: it is copied
    detached, as the value it holds."""
    try:
        return copy.deepcopy(obj)
    except RuntimeError as exc:
        if "graph leaves" not in str(exc):
            raise
    from torchdoctor._walk import walk

    memo: dict[int, Any] = {}
    held = [e.tensor for e in walk(obj).entries if e.tensor.grad_fn is not None]
    for t in held:
        memo[id(t)] = t.detach().clone()
    memo[id(memo)] = held  # keep-alive, as copy.deepcopy does
    return copy.deepcopy(obj, memo)
