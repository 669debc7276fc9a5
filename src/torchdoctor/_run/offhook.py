"""A parameter left on the cpu under a module that accelerate's offload hook manages, said with the hook.

``cpu_offload_with_hook`` (and a pipeline's ``enable_model_cpu_offload``) keeps a sub-model on the cpu and moves it
to the execution device only when that sub-model's own forward is called. A program that calls an inner layer of it
directly (``self.semantic.input_embeds_layer(ids)`` before ``self.semantic(...)``) meets the layer's weights on the
cpu. The weights were moved there by the hook, not by the program: the report names the hooked module and says the
call went around it, so nobody reads it as a ``.to`` that was forgotten (or pokes ``.data``, which the hook undoes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchdoctor._virtual.offloaduse import offloading_hook


def hook_notes(problems: Sequence[Any], roots: Sequence[Any]) -> dict[str, str]:
    """path -> why a parameter/buffer problem's tensor is on the cpu when a module above it is offloaded by an
    accelerate hook and the op ran outside that module's own (hooked) forward."""
    out: dict[str, str] = {}
    for p in problems:
        if p.kind != "device" or p.role not in ("parameter", "buffer") or "." not in p.path:
            continue
        for root in roots:
            hit = _hooked_above(root, p.path)
            if hit is not None:
                name, cls, inner = hit
                out[p.path] = (f"`{name}` is offloaded by accelerate's hook ({cls}): its weights come to the execution "
                               f"device only while `{name}(...)` runs, and this op ran in `{inner}` called outside it; "
                               f"call through `{name}`, or give `{inner}` its own hook (cpu_offload_with_hook)")
                break
    return out


def _hooked_above(root: Any, path: str) -> tuple[str, str, str] | None:
    """(the hooked module's path, its hook class, the module the op ran in) for the tensor at ``path`` under ``root``."""
    parts = path.split(".")[:-1]
    m = root
    chain: list[tuple[str, Any]] = []
    for i, part in enumerate(parts):
        m = getattr(m, "_modules", {}).get(part)
        if m is None:
            return None
        chain.append((".".join(parts[:i + 1]), m))
    inner = ".".join(parts)
    for name, mod in chain[:-1]:  # a module above the one the op ran in: its own forward would have loaded it
        cls = offloading_hook(vars(mod).get("_hf_hook"))
        if cls is not None:
            return name, cls, inner
    return None
