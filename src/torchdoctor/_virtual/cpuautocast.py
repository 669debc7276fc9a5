"""``torch.autocast("cpu")`` around ops of a virtual device: on the real device it casts nothing of theirs.

A virtual tensor's C++ side is a CPU tensor (with ``data="cpu"``), so torch's own CPU autocast would cast the
operands of a virtual cuda op to the CPU's autocast dtype, and a program that wraps its cuda model in
``torch.autocast(device_type="cpu")`` (a wrong ``device_type``, a real bug) would run clean on virtual devices while
the real GPU raises "expected mat1 and mat2 to have the same dtype". The run's mode switches the CPU's autocast off
for an op that reads a virtual tensor, so the op runs as it would on the device: the device's own autocast is
emulated (``dispatch.autocast_args``), the CPU's is not applied.
"""

from __future__ import annotations

from typing import Any

import torch

from torchdoctor._virtual.tensor import VirtualTensor


def touches(args: tuple[Any, ...]) -> bool:
    """Does the op read a tensor of the virtual device (an argument, or one in a list of them)? A cpu tensor the
    run made (a ``VirtualTensor`` labelled cpu) is the CPU's, autocast as ever."""
    return any(_device_one(a) or (isinstance(a, (list, tuple)) and any(_device_one(x) for x in a)) for a in args)


def _device_one(x: Any) -> bool:
    return isinstance(x, VirtualTensor) and x._td_device.type != "cpu"


def off() -> Any:
    """The CPU's autocast switched off while one op of the device runs."""
    return torch.autocast("cpu", enabled=False)
