"""Length tensors that torch reads on the CPU as a list of ints, read so in a virtual run too.

``F.ctc_loss(log_probs, targets, input_lengths, target_lengths)`` on CUDA takes CPU int64 lengths: for plain tensors
its C++ composite copies them to the CPU and passes them on as an ``IntArrayRef`` (the mean reduction then divides by
``at::tensor(target_lengths, <the loss's device>)``). Virtual tensors are tensor subclasses, which torch sends down
the composite's other branch, where a CPU ``target_lengths`` divides the loss on the device: a placement error real
hardware never raises. Here CPU lengths are handed over as the lists the fast branch makes, and the call runs again
under the run's mode; lengths on the device stay as they are (both branches agree on them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from torchdoctor._placement import tensor_device
from torchdoctor._virtual.tensor import VirtualTensor, host_values

def _as_list(t: Any) -> list[int] | None:
    """A CPU integer tensor's values, as the fast branch reads them; None for anything else (left to torch)."""
    if not isinstance(t, torch.Tensor) or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool \
            or tensor_device(t).type != "cpu" or t.dim() != 1:
        return None
    if isinstance(t, VirtualTensor):  # a CPU tensor the run lifted (a module's input): its values, if it keeps them
        if t._td_elem.device.type == "meta":
            return None
        t = host_values(t)
    try:
        with torch._C.DisableTorchFunction():
            return [int(v) for v in t.tolist()]
    except Exception:  # no values to read: the call goes on as written
        return None


def handlers(mode: Callable[[Any], Any]) -> dict[Any, Callable[..., Any]]:
    """``F.ctc_loss`` and ``torch.ctc_loss`` with CPU lengths, called again with those lengths as lists under a
    fresh push of the run's mode ``mode(space)``."""
    def ctc_loss(space: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        new_args, new_kwargs = list(args), dict(kwargs)
        changed = False
        for i, name in ((2, "input_lengths"), (3, "target_lengths")):
            if i < len(new_args) and (v := _as_list(new_args[i])) is not None:
                new_args[i], changed = v, True
            elif name in new_kwargs and (v := _as_list(new_kwargs[name])) is not None:
                new_kwargs[name], changed = v, True
        if not changed:
            return func(*args, **kwargs)
        with mode(space):
            return func(*new_args, **new_kwargs)

    return {F.ctc_loss: ctc_loss, torch.ctc_loss: ctc_loss}
