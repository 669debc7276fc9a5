"""An op's arguments: how they are addressed (keys ``(position or kwarg name, index in a list or -1)``) and the
fast checks that run on every aten op before any rule looks (one device, one dtype)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchdoctor._placement import FLOAT8_DTYPES, tensor_device

_Tensor = torch.Tensor

Key = tuple[Any, int]  # (position or kwarg name, index in a list argument or -1)


class OpArgs:
    """An op's arguments, addressed by the rules' keys ``(position or kwarg name, index in a list or -1)``: the one
    way the rules, guard's fixer and the simulator read and replace an argument."""

    args: Sequence[Any]
    kwargs: Mapping[str, Any]

    def __init__(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        self.args, self.kwargs = args, kwargs

    def at(self, key: Key) -> Any:
        pos, j = key
        v: Any = self.kwargs.get(pos) if isinstance(pos, str) else self.args[pos]
        return v[j] if j >= 0 else v

    def put(self, key: Key, value: Any) -> None:
        """Replace one argument in place (``args`` a list, ``kwargs`` a dict); a list item keeps its sequence type."""
        pos, j = key
        holder: Any = self.kwargs if isinstance(pos, str) else self.args
        if j >= 0:
            seq = holder[pos]
            value = type(seq)(value if i == j else x for i, x in enumerate(seq))
        holder[pos] = value


_FLOAT8 = FLOAT8_DTYPES


_CASTS = frozenset({"aten::_to_copy", "aten::copy_", "aten::to", "aten::_copy_from", "aten::_copy_from_and_resize",
                    "aten::clone", "aten::view", "aten::_scaled_mm", "aten::detach", "aten::alias"})


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _plain_agree(args: Sequence[Any], any_dtype: bool) -> bool:
    """Top-level plain tensors share one device (and one dtype unless ``any_dtype``); anything else: False (the
    general path decides)."""
    dev = dt = None
    for a in args:
        tp = type(a)
        if (tp is _PLAIN[0] or tp is _PLAIN[1]) and "_td_device" not in a.__dict__:
            if dev is None:
                dev, dt = a.device, a.dtype
            elif a.device != dev or (a.dtype is not dt and (not any_dtype or a.dtype in _FLOAT8 or dt in _FLOAT8)):
                return False
        elif tp is list or tp is tuple:
            for x in a:  # a shape or a dim list is fine; tensors in a list go the general way
                if isinstance(x, _Tensor):
                    return False
        elif isinstance(a, _Tensor):
            return False
    return True


def _uniform(seq: Any, state: list[Any]) -> bool:
    """One level over ``seq``; ``state`` is [device, dtype, dtypes differ] of the tensors so far. False as soon as
    two devices differ; differing dtypes only set ``state[2]`` (most ops have no dtype rule: ``where`` with a
    bool mask, ``embedding`` with int64 indices)."""
    for a in seq:
        if isinstance(a, _Tensor):
            if state[1] is None:
                state[0], state[1] = tensor_device(a), a.dtype
            else:
                if tensor_device(a) != state[0]:
                    return False
                if a.dtype is not state[1]:
                    state[2] = True
        elif type(a) is list or type(a) is tuple:
            if not _uniform(a, state):
                return False
    return True
