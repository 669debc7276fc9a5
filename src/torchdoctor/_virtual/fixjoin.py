"""The culprits of a virtual run's fix, one per tensor: a tensor wrong in device and in dtype gets one ``.to(device,
dtype)``, a device fix of a floating tensor in another dtype than the run asked for casts it too, and a cast or move
to what a tensor already is is never written (``fixes``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from torchdoctor._placement import FLOAT8_DTYPES

__all__ = ["add_culprit", "no_op", "stale_source", "with_dtype"]


def with_dtype(path: str, target: Any, dtype: torch.dtype | None,
               have: Mapping[str, tuple[torch.dtype, torch.device]]) -> Any:
    """A device fix of a floating tensor that is not in the dtype the run asked for moves and casts it in one
    ``.to``: a device-only fix would leave it in its old dtype, silently promoting what it meets."""
    now = have.get(path)
    if dtype is None or now is None or isinstance(target, torch.dtype) or not now[0].is_floating_point or \
            now[0] == dtype or now[0] in FLOAT8_DTYPES:
        return target
    return (target, dtype)


def no_op(culprit: tuple[str | None, str, str, Any], have: Mapping[str, tuple[torch.dtype, torch.device]]) -> bool:
    """A cast to the dtype (or a move to the device) the tensor already has: it would change nothing."""
    path, _, _, target = culprit
    now = have.get(path or "")
    if now is None:
        return False
    wants = target if isinstance(target, tuple) else (target,)
    return all(w == (now[0] if isinstance(w, torch.dtype) else now[1]) for w in wants)


def add_culprit(culprits: list[tuple[str | None, str, str, Any]], path: str | None, label: str, kind: str,
                target: Any) -> None:
    """One culprit per tensor: a tensor wrong in device and in dtype gets one ``.to(device, dtype)``, not a move
    that leaves the dtype wrong (the fix of its second problem)."""
    for i, (p, lab, k, t) in enumerate(culprits):
        if lab != label:
            continue
        have = t if isinstance(t, tuple) else (t,)
        if kind == k or any(type(x) is type(target) for x in have):
            return
        both = tuple(sorted((*have, target), key=lambda v: isinstance(v, torch.dtype)))  # device first
        culprits[i] = (p, lab, "device" if "device" in (k, kind) else k, both)
        return
    culprits.append((path, label, kind, target))



def stale_source(dropped: list[tuple[str | None, str, str, Any]],
                 have: Mapping[str, tuple[torch.dtype, torch.device]]) -> str | None:
    """The note for tensors made from a model tensor that is right now: they were made while it was still in its old
    dtype or on its old device (a KV cache filled before ``model.to(torch.bfloat16)``), so no move or cast of the model
    changes them; ``None`` when nothing was dropped as a no-op."""
    named = [(c[1], have[c[0] or ""]) for c in dropped if (c[0] or "") in have]
    if not named:
        return None
    src, (dtype, device) = named[0]
    more = f" (and {len(named) - 1} more)" if len(named) > 1 else ""
    return (f"# the tensors the failing op met were made from {src}{more} before it became {str(dtype)[6:]} on "
            f"{device}: no move or cast of the model changes them now; make them again after the model's cast or move "
            "(a cache or state filled before it is filled again after), or cast them where the program holds them")
