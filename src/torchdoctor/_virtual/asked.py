"""A run asked for a dtype the code did not compute in (``call=`` runs the user's objects as they are): said as a
problem, so a report never reads as if the run checked the dtype asked for."""

from __future__ import annotations

from typing import Any

import torch


def ran_as_asked(dtype: Any, roots: list[Any], computed: dict[Any, int] | None = None) -> list[Any]:
    """A run asked for a dtype (``dtype=float16``) that the code did not compute in (``call=`` runs the user's
    objects as they are): a problem saying in which dtype it ran, so the report never reads as if the run checked
    the dtype asked for. What ran is what the matmul-like ops computed in (``computed``: autocast over float32
    weights, diffusers' layerwise casting of float8 storage ran in the dtype they cast to); the weights' dtype only
    when no such op ran."""
    from torchdoctor._placement import dtype_str
    from torchdoctor._report.model import Problem

    if dtype is None:
        return []
    sizes: dict[Any, int] = {d: n for d, n in (computed or {}).items() if d is not None}
    for root in roots if not sizes else ():
        if isinstance(root, torch.nn.Module):
            for t in root.parameters():
                if t.is_floating_point():
                    sizes[t.dtype] = sizes.get(t.dtype, 0) + t.nelement() * t.element_size()
    ran = max(sizes, key=sizes.__getitem__) if sizes else None
    if ran is None or ran == dtype:
        return []
    asked, got = dtype_str(dtype), dtype_str(ran)
    return [Problem("dtype", "<run>", "run", got, asked, f"the code ran with {got} weights, not {asked}: this run "
                    f"does not show whether it works in {asked} (call= runs your objects as they are; cast them "
                    f"first, e.g. model.to(torch.{asked}))", op="simulate")]
