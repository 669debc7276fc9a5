"""Objects whose placement is the program's own per-call mechanism, which ``simulate`` checks as placed.

A model offloaded by hooks — the program's own forward pre-hooks that move each layer in (a sequential offload, a
block swap), diffusers' group offloading, accelerate's CPU offload (``cpu_offload``, ``cpu_offload_with_hook``,
diffusers' ``enable_model_cpu_offload``) — is never moved whole by the program that runs it: the hooks place each
layer when it runs, because the whole model does not fit. A ``simulate`` that moved it whole (``model.to(device)``)
would check another program, and hide what the hooks never move (a Parameter of a module above the layers they
place). So such a model is checked as the hooks place it: moved to the dtype asked for only, its layers placed by
its hooks during the forward, and its problems fixed where the program uses what they miss (``bareuse``).
"""

from __future__ import annotations

import ast
from typing import Any

import torch

__all__ = ["placed_by_hooks"]

_OFFLOADING = ("CpuOffload", "UserCpuOffloadHook", "GroupOffloadingHook")  # hooks that onload per call


def placed_by_hooks(found: Any, device: torch.device) -> str | None:
    """What places the walked object's layers per call on ``device`` (said in a report), when hooks do (module
    doc); None when the object is to be moved as a user would move it."""
    from torchdoctor._walk.kinds import hook_chain

    for _, _, hook in found.hooks:  # accelerate's and diffusers' offloading hooks
        for h in hook_chain(hook):
            d = getattr(h, "__dict__", None) or {}
            name = type(h).__name__
            if name in _OFFLOADING or d.get("offload") or d.get("weights_map") is not None:
                return f"{name} places its layers per call"
    if not any(getattr(m, "_forward_pre_hooks", None) for _, m in found.modules):
        return None  # (the common case, read once per module: no per-layer look at the model's code)
    from torchdoctor._virtual.bareuse import placement_of

    for _, root in found.roots:
        if not isinstance(root, torch.nn.Module):
            continue
        try:
            placed = placement_of(root, device)
        except Exception:  # an odd model: moved as before
            continue
        if placed is not None and (placed.hooks or placed.pre is not None and moves(placed.pre)):
            return placed.said
    return None


def moves(hook: Any) -> bool:
    """A program's hook whose code moves what it is given: a ``.to(...)`` / ``.cuda()`` call or a ``.data =``
    assignment (a logging or shape-checking hook places nothing)."""
    from torchdoctor._virtual.hookleft import parsed

    tree = parsed(hook if not hasattr(hook, "__func__") else hook.__func__)
    if tree is None:
        return False
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in (
                "to", "cuda", "xpu", "mps", "npu", "to_empty"):
            return True
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "data" for t in n.targets):
            return True
    return False
