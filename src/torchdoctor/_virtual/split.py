"""A model the program split over accelerators itself (``vision_tower.to("cuda:1")``, ``language_model.to("cuda:0")``;
a device map written by hand): each part computes where the program put it, not on the device the run was asked for.

Then no part is "not moved", and at an op that mixes two devices the odd operand is the one away from the part's
weights or, among activations alone, away from the op's first operand (torch's device for the op): the projector's
``image_features`` on cuda:1 scattered into ``inputs_embeds`` on cuda:0 is the culprit, fixed by
``image_features.to(inputs_embeds.device)`` at that line, never by moving the whole model.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from torchdoctor._placement import norm_device, tensor_device
from torchdoctor._virtual.origin import LIKE, operand_at


def placed_apart(roots: list[Any], vtype: str) -> bool:
    """The floating parameters of ``roots`` sit on two or more ``vtype`` devices, or some on the CPU in a module
    the program hooks on both sides itself (experts kept on the CPU, a pre-hook moving their inputs there and a
    forward hook their output back: a deliberate offload)."""
    seen: set[Any] = set()
    for root in roots:
        for mod in root.modules():
            for t in itertools.chain(mod._parameters.values(), mod._buffers.values()):
                if t is None or not t.is_floating_point():
                    continue
                d = tensor_device(t)
                if d.type == vtype or d.type == "cpu" and mod._forward_pre_hooks and mod._forward_hooks:
                    seen.add(norm_device(d))
                    if len(seen) > 1:
                        return True
    return False


def odd_ones(groups: dict[Any, list[Any]], with_entries: list[Any], tensors: list[Any]) -> tuple[list[Any], Any] | None:
    """In a split model: the operands to blame and the device they belong on (the weights' device when one group
    holds model tensors, else the first operand's, of ``tensors``), or None when that device is not among the groups."""
    ref = with_entries[0] if len(with_entries) == 1 else norm_device(tensor_device(tensors[0])) if tensors else None
    if ref not in groups:
        return None
    return [k for v, ks in groups.items() if v != ref for k in ks], ref


def note_like(named_at: str, tensors: list[Any], device: Any) -> None:
    """The operand on ``device`` at the culprit's line, by the name the line calls it (``inputs_embeds``): the fix
    moves the culprit to its device (``origin.LIKE``, read by ``makers.operand_fix``)."""
    like = next((x for x in tensors if norm_device(tensor_device(x)) == device), None)
    other = operand_at(like) if like is not None else None
    if other is None and like is not None:  # a twin of the program's real tensor: the one local of the line there
        other = _local_on(device, named_at)
    if other is not None and other.partition(" at ")[2] == named_at.partition(" at ")[2]:
        LIKE[f"operand {named_at}"] = other.partition(" at ")[0]


def _local_on(device: Any, named_at: str) -> str | None:
    """``g at app.py:20``: the one tensor local of the program's frame at ``named_at``'s line that is on ``device``
    and written on that line (``g.mul_(coef)``), or None."""
    import linecache
    import re

    from torchdoctor._virtual.origin import short_at, user_frame

    f = user_frame(3)
    at = named_at.partition(" at ")[2]
    if f is None or short_at(f) != at:
        return None
    line = linecache.getline(f.f_code.co_filename, f.f_lineno)
    hits = [n for n, v in f.f_locals.items() if isinstance(v, torch.Tensor) and re.search(
        rf"(?<![\w.]){re.escape(n)}\b", line) and norm_device(tensor_device(v)) == device]
    return f"{hits[0]} at {at}" if len(hits) == 1 else None
