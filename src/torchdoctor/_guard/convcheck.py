"""strict's check of a convolution module's bias when the module starts: ``conv2d`` checks the bias dtype in C++
before any aten op is dispatched, so the dispatch mode never sees it (fix / warn align it in ``CompositeCheck``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

_CONV = torch.ops.aten.convolution.default  # what a convolution module's bias is checked as
_Tensor = torch.Tensor


class ConvReplay:
    """A convolution module's op on (input, weight, bias), the rest of its arguments (stride, padding, dilation,
    groups, output padding, padding mode) as the module holds them: what a proof re-runs."""

    def __init__(self, mod: Any) -> None:
        self.mod = mod

    def __call__(self, x: Any, weight: Any, bias: Any) -> Any:
        m = self.mod
        if not getattr(m, "transposed", False):
            return m._conv_forward(x, weight, bias)
        n = len(m.kernel_size)
        f = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[n - 1]
        return f(x, weight, bias, m.stride, m.padding, m.output_padding, m.groups, m.dilation)

    def __str__(self) -> str:
        return str(_CONV)


def conv_pre(session: Any, mod: nn.Module, x: Any) -> None:
    """strict: ``conv2d`` checks the bias dtype before any aten op is dispatched, so the dispatch mode never
    sees it: look here (fix / warn align it in ``CompositeCheck``)."""
    bias = mod.bias
    if session.replaying or not isinstance(x, _Tensor) or not isinstance(bias, _Tensor) or bias.dtype == x.dtype \
            or torch.is_autocast_enabled(x.device.type):  # autocast casts input, weight and bias alike
        return
    if "forward" in mod.__dict__ or mod._forward_pre_hooks:  # a hook wrapper (diffusers layerwise casting,
        return  # accelerate) or the module's own pre-hook (weight_norm recomputes `weight`) runs after this one
        # and may cast, move or remake the weights: the composite's own error is explained if it still fails
    from torchdoctor._rules import registry as _rules

    found = _rules.find(_CONV, (x, mod.weight, bias), {}, session.g.profile)
    if found:  # the replay (a proof) runs the module's own convolution: every argument as the module has it
        session.on_problem(ConvReplay(mod), (x, mod.weight, bias), {}, found, schema_op=_CONV)
