"""The tensor an op writes (``losses.masked_fill_(mask, 0)``'s ``losses``, ``torch.add(a, b, out=c)``'s ``c``): where
the program keeps its result, so at a device mismatch it stays and what the op reads is the odd one out.

Moving the written tensor would write into a copy the program never sees again (its ``losses`` keeps the old values
on its own device), and a run that went on with the op elsewhere would carry the result, its loss and its backward to
a device the program never put them on: gradient findings that real hardware never reaches.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from torchdoctor._placement import norm_device
from torchdoctor._virtual.tensor import VirtualTensor, is_entry


# a kernel's dtype dispatch refusing an integer or bool dtype ("lerp_kernel_scalar" not implemented for 'Long')
INT_KERNEL = re.compile(r"not implemented for '(Long|Int|Short|Char|Byte|Bool|UInt16|UInt32|UInt64)'")


def written_key(schema: Any, call: Any) -> Any:
    """The key of the tensor the op writes: its first argument for an in-place op (``add_``, ``masked_fill_``,
    ``copy_``, ``index_put_``, ``masked_scatter_``), its ``out=`` tensor for an out variant; None for any other op
    or when that argument is not one tensor."""
    args = getattr(schema, "arguments", None) or ()
    for i, a in enumerate(args):
        alias = getattr(a, "alias_info", None)
        if alias is None or not alias.is_write:
            continue
        key = (a.name, -1) if a.kwarg_only else (i, -1)
        try:
            t = call.at(key)
        except (IndexError, KeyError):
            continue
        return key if isinstance(t, (torch.Tensor, list, tuple)) else None
    return None


def keeps_written(schema: Any, f: Any, call: Any) -> tuple[list[Any], torch.device, list[Any]] | None:
    """At a device mismatch of an op that writes one of its operands: the operands read from another device (to go
    where the written tensor is), that device, and the written tensor's key (in a list). None for any other op, or
    when the written tensor is the model's own and what it reads is more than 0-dim values (a weight or buffer left
    behind: the model's placement decides there; a cuda grad-norm coefficient into a cpu gradient joins it)."""
    key = written_key(schema, call)
    if key is None:
        return None
    if not isinstance(call.at(key), torch.Tensor):  # a list an op writes per index (``_foreach_lerp_``): that index's
        key = next((k for k in (list(f.considered) or list(f.offenders)) if k[0] == key[0]), None)
        if key is None:
            return None
    own_t = call.at(key)
    if not isinstance(own_t, VirtualTensor):
        return None
    own = norm_device(own_t._td_device)
    keys = [k for k in (list(f.considered) or list(f.offenders)) if k != key]
    odd = [k for k in keys if isinstance(t := call.at(k), VirtualTensor) and norm_device(t._td_device) != own]
    if not odd:
        return None
    if is_entry(own_t) and not all(call.at(k).dim() == 0 for k in odd):
        return None
    return odd, own, [key]


def keeps_written_dtype(schema: Any, f: Any, call: Any) -> tuple[list[Any], torch.dtype] | None:
    """At a dtype mismatch of an op that writes one of its operands (``ema_p.lerp_(p, w)``): the floating operands
    it reads in another dtype, and the written tensor's dtype, which the op keeps (real PyTorch refuses the mix:
    "expected dtype Float for `end`"). None for any other op, when the written tensor is the model's own (the
    model's dtype decides there), or when no model tensor is read in another dtype (a cast's maker decides)."""
    key = written_key(schema, call)
    own_t = call.at(key) if key is not None else None
    if not isinstance(own_t, torch.Tensor) or not own_t.is_floating_point() or is_entry(own_t):
        return None
    odd = [k for k in (list(f.considered) or list(f.offenders)) if k != key and isinstance(t := call.at(k), torch.Tensor)
           and t.is_floating_point() and t.dim() > 0 and t.dtype != own_t.dtype]
    return (odd, own_t.dtype) if any(is_entry(call.at(k)) for k in odd) else None  # a model's tensor read

