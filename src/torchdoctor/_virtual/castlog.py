"""The runs recording the program's module casts now (``modcast``), read without its machinery: the model's dtype
as the program's own code cast it (``stackview.model_dtype``)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["ACTIVE", "declared"]

ACTIVE: list[Any] = []  # ``modcast.Casts`` of the runs recording now (runs in threads may end in any order)


def declared(mod: torch.nn.Module) -> torch.dtype | None:
    """The dtype the program's own code last cast ``mod`` itself to in a run recording now (``unet.to(device,
    torch.float16)``), or None: the model's dtype as the program declared it."""
    for casts in reversed(ACTIVE):
        last = casts.last(mod)
        if last is not None:
            return last[0]
    return None
