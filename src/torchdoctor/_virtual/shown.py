"""How a virtual tensor prints: as torch prints a tensor on that device (``tensor([1, 1], device='cuda:0')``) when it
holds real values (a run on the cpu's data), so a program's own output reads as it would on the hardware; a tensor
that holds no values (meta) says what it is (``VirtualTensor(f32[2,3]@cuda:0)``)."""

from __future__ import annotations

from typing import Any

import torch

_SUFFIXES = (", size=", ", dtype=", ", grad_fn=", ", requires_grad=", ", layout=")


def shown(t: Any) -> str:
    from torchdoctor._placement import compact, device_str

    elem = t._td_elem
    if elem.device.type == "meta" or elem.layout != torch.strided:
        where = f", path={t._td_path!r}" if t._td_path else ""
        return f"VirtualTensor({compact(t.dtype, tuple(t.shape), t._td_device)}{where})"
    with torch._C.DisableTorchFunction():
        text = repr(elem.detach())
    cut = min((i for i in (text.find(s) for s in _SUFFIXES) if i > 0), default=len(text) - 1)
    fn = t.grad_fn
    grad = f", grad_fn=<{type(fn).__name__}>" if fn is not None else ", requires_grad=True" if t.requires_grad else ""
    return f"{text[:cut]}, device='{device_str(t._td_device)}'{text[cut:-1]}{grad})"
