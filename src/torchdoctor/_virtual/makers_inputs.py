"""The inputs of a virtual run, made where the user would make them: on the simulated device, floating ones in the
dtype asked for, each named as ``simulate`` names them (``input 0``, ``kwarg mask``), so a problem one of them causes
says which input it was and the fix can pass it as it should be."""

from __future__ import annotations

from typing import Any

import torch

from torchdoctor._virtual.tensor import Space, VirtualTensor, current_space, make, unsupported_form


def place_inputs(space: Space, value: Any, device: torch.device, dtype: torch.dtype | None, path: str,
                  assume: torch.device | None = None) -> Any:
    """Inputs go where the user would put them: on ``device``, floating ones in ``dtype``. An input on meta is
    taken as loaded, as the weights are, only when meta tensors are assumed on a device; else its move is checked
    (and fails as the real one would)."""
    if isinstance(value, torch.Tensor):
        elem = space.inner_of(value)
        if value.device.type == "meta" and assume is None:
            return make(VirtualTensor, elem, value.device, path).to(device, dtype if elem.is_floating_point() else None)
        return make(VirtualTensor, elem.to(dtype) if dtype is not None and elem.is_floating_point() else elem,
                    device, path)
    if isinstance(value, dict):
        return type(value)({k: place_inputs(space, v, device, dtype, f"{path}.{k}", assume) for k, v in value.items()})
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(place_inputs(space, v, device, dtype, f"{path}.{i}", assume) for i, v in enumerate(value))
    return value


def placed_on(value: Any, device: torch.device, dtype: torch.dtype | None, assume: torch.device | None,
               path: str) -> Any:
    """Inputs a TARGET returned, where the user would put them: on ``device``, floating ones in ``dtype``; named
    ``input 0`` / ``kwarg mask`` as ``simulate`` names them, and taken as loaded on ``assume`` when on meta, as the
    model's weights are."""
    if isinstance(value, torch.Tensor):
        space = current_space()
        if not isinstance(value, VirtualTensor) and space is not None and unsupported_form(value) is None:
            # the TARGET's CPU or meta tensors stayed real: a twin where it is, to be named and placed
            value = make(VirtualTensor, space.inner_of(value), value.device, path)
        if isinstance(value, VirtualTensor):
            if value._td_path is None:
                value._td_path = path
            if assume is not None and value._td_device.type == "meta":
                value._td_device = assume
        return value.to(device, dtype) if dtype is not None and value.is_floating_point() else value.to(device)
    if isinstance(value, dict):
        return type(value)({k: placed_on(v, device, dtype, assume, f"{path}.{k}") for k, v in value.items()})
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(placed_on(v, device, dtype, assume, f"{path}.{i}") for i, v in enumerate(value))
    return value
