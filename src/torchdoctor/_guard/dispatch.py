"""strict / fix / warn per op: a dispatch mode that checks every aten op against the rules, and a function mode
for convolutions, whose C++ composite compares input and bias dtypes before any aten op is dispatched."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from sys import modules as _modules
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from torchdoctor._rules import registry as _rules

_find = _rules.find

Session = Any  # the guard session that owns these modes (torchdoctor._guard.session; it imports this module)


def _simulating() -> bool:
    """A ``simulate`` / ``virtual_devices`` run is active in this thread (it checks its own ops)."""
    sim = _modules.get("torchdoctor._virtual.tensor")
    return sim is not None and sim.current_space() is not None


_CONV = torch.ops.aten.convolution.default


_CONV_FUNCS = frozenset({torch.conv1d, torch.conv2d, torch.conv3d, torch.conv_transpose1d, torch.conv_transpose2d,
                         torch.conv_transpose3d})


class ConvCheck(TorchFunctionMode):
    """Active only during the forward of a conv module whose bias disagrees with its input (see ``_conv_pre``)."""

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _CONV_FUNCS and len(args) >= 2:
            args = (*args[:2], kwargs.get("bias") if len(args) < 3 else args[2], *args[3:])
            kwargs = {k: v for k, v in kwargs.items() if k != "bias"}
            found = _rules.find(_CONV, args[:3], {}, self.session.g.profile)
            if found:
                return self.session.on_problem(func, args, kwargs, found, schema_op=_CONV)
        return func(*args, **kwargs)


class CheckMode(TorchDispatchMode):
    """Checks every op against the strict rules before it runs; problems go to the session."""

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        self.profile = session.g.profile

    def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        if kwargs is None:
            kwargs = {}
        sim = _modules.get("torchdoctor._virtual.tensor")
        if sim is not None and sim.current_space() is not None:  # a simulation checks its own ops with these rules
            return func(*args, **kwargs)
        found = _find(func, args, kwargs, self.profile)
        if found:
            return self.session.on_problem(func, args, kwargs, found)
        return func(*args, **kwargs)
