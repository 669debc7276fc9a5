"""What the run checks before a C++ composite reaches dispatch: ``torch.conv*`` and
``scaled_dot_product_attention`` compare their operands' dtypes in C++ before any aten op runs, so the rules see
those calls first (and fix the culprits), or the error would escape unrecorded. Called by the runtime's mode."""

from __future__ import annotations

from typing import Any

import torch

from torchdoctor._virtual.tensor import Space, VirtualTensor

aten = torch.ops.aten


# C++ conv composites compare input and bias dtypes before dispatch ("Input type (float) and bias type
# (c10::BFloat16) should be the same"): the rules must see these calls first, or the error escapes unrecorded
_CONV_NAMES = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
CONV_ENTRY = {getattr(torch, n): getattr(getattr(aten, n), getattr(aten, n).overloads()[0]) for n in _CONV_NAMES}


def conv_precheck(space: Space, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """Input, weight and bias of a conv call checked (and fixed) by the space's hooks when input and bias differ."""
    names = ("input", "weight", "bias")
    vals = [args[i] if i < len(args) else kwargs.get(n) for i, n in enumerate(names)]
    x, _, b = vals
    if not (isinstance(x, VirtualTensor) and isinstance(b, VirtualTensor) and isinstance(vals[1], VirtualTensor)) \
            or x.dtype == b.dtype:
        return args, kwargs
    fixed, _ = space.hooks.check(CONV_ENTRY[func], tuple(vals), {})
    out, kw = list(args), dict(kwargs)
    for i, (n, v) in enumerate(zip(names, fixed)):
        if i < len(out):
            out[i] = v
        else:
            kw[n] = v
    return tuple(out), kw


SDPA_ENTRY = torch._C._nn.scaled_dot_product_attention
_SDPA = aten.scaled_dot_product_attention.default
_SDPA_NAMES = ("query", "key", "value", "attn_mask")


def sdpa_precheck(space: Space, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """Query, key, value and mask of ``scaled_dot_product_attention`` checked (and fixed) by the space's hooks
    when their dtypes differ: the composite refuses the mix before any aten op is dispatched."""
    vals = [args[i] if i < len(args) else kwargs.get(n) for i, n in enumerate(_SDPA_NAMES)]
    qkv = [v for v in vals[:3] if isinstance(v, VirtualTensor)]
    if len(qkv) < 3 or (len({v.dtype for v in qkv}) == 1 and not isinstance(vals[3], VirtualTensor)):
        return args, kwargs
    fixed, _ = space.hooks.check(_SDPA, tuple(vals), {})
    out, kw = list(args), dict(kwargs)
    for i, (n, v) in enumerate(zip(_SDPA_NAMES, fixed)):
        if i < len(out):
            out[i] = v
        elif n in kw:
            kw[n] = v
    return tuple(out), kw
