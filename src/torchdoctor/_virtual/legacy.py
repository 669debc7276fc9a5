"""Legacy type strings on a virtual device: ``t.type()`` answers ``'torch.cuda.FloatTensor'`` and
``t.type('torch.cuda.HalfTensor')`` / ``t.type(torch.cuda.HalfTensor)`` / ``t.type(torch.float16)`` move and cast
as on the device (a handler of the runtime's function mode)."""

from __future__ import annotations

from typing import Any

import torch

from torchdoctor._placement import tensor_device
from torchdoctor._virtual import devices_api as api, host as H
from torchdoctor._virtual.tensor import Space, VirtualTensor, is_virtual

_CPU = torch.device("cpu")


def legacy_type(space: Space, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``t.type()`` -> ``'torch.cuda.FloatTensor'``; ``t.type('torch.cuda.HalfTensor')`` / ``t.type(torch.cuda.
    HalfTensor)`` / ``t.type(torch.float16)`` move and cast as on the device."""
    self, want = args[0], args[1] if len(args) > 1 else kwargs.get("dtype")
    if want is None:
        if not isinstance(self, VirtualTensor):
            return func(*args, **kwargs)
        name = api.legacy_name(self.dtype) or self._td_elem.type().rpartition(".")[2]
        here = self._td_device.type
        return f"torch.{name}" if here == "cpu" else f"torch.{here}.{name}"
    if isinstance(want, torch.dtype):
        return H.MOVE(space, self, None, want) if isinstance(self, VirtualTensor) else func(*args, **kwargs)
    parsed = api.parse_legacy(want if isinstance(want, str) else
                              f"{getattr(want, '__module__', 'torch')}.{getattr(want, '__name__', '')}")
    if parsed is None:
        return func(*args, **kwargs)
    kind, dtype = parsed
    src = tensor_device(self)
    # a type of the device type the tensor is on keeps its index, as on the device
    target = _CPU if kind is None else src if src.type == kind else space.norm(kind)
    if not isinstance(self, VirtualTensor) and not is_virtual(target):
        return func(*args, **kwargs)
    return H.MOVE(space, self, target, dtype)

