"""Calls answered as one aten op: ``F.linear`` and ``F.scaled_dot_product_attention`` on virtual tensors that agree.

Both are C++ composites. On a wrapper subclass they decompose before dispatch: a linear into 3-5 aten ops (``t``,
``view``, ``mm``, ``_unsafe_view``), an attention into ~30 (the math path), each one a Python hop through the run's
op path, and the attention's causal mask is built on plain meta tensors that never reach dispatch (``tril``'s
Python meta kernel, ~2 ms, every call). Sent to dispatch as the one aten op they are (``aten.linear``,
``aten.scaled_dot_product_attention``), the rules check the call with every operand the user passed (the matmul
and attention rules know both ops) and the meta kernel's answer is remembered (``kernels``), so a repeated layer
costs one hop.

Only when nothing inside the decomposition could be a problem: every tensor operand a plain virtual tensor (no
library ``__torch_function__``), all on one device label, all of one dtype (an attention mask bool or the query's
dtype), and no autograd graph to record (grad off, or no operand requires grad: the op bypasses autograd). Anything
else (a mixed dtype, a CPU operand, a plain tensor, training, autocast) decomposes as before, where the rules see
each part. A linear also needs its weight (and bias) named by the model, and a 2-d or contiguous 3-d input: then
the provenance its result gets is the decomposition's, op for op (``named``). An attention on real values (small tensors, ``data="cpu"``) decomposes too: as one op it would run
another CPU kernel (other rounding: data-dependent code after it, a MoE router's top-k, could take another branch),
and the decomposed causal path makes its output meta (its mask is made on meta), which the code after it meets.
"""

from __future__ import annotations

from typing import Any

import torch

from torchdoctor._virtual.origin import made_from
from torchdoctor._virtual.tensor import VirtualTensor, current_space

aten = torch.ops.aten
ENABLED = True  # tests turn it off to compare runs with and without it
LINEAR = True  # F.linear as one op (its result named as the decomposition names it: ``named``); bench/simulate_whole.py
_PLAIN_TF = VirtualTensor.__torch_function__
_LINEAR = (torch.nn.functional.linear, torch._C._nn.linear)
_LINEAR_NAMES = ("input", "weight", "bias")
_LINEAR_DEFAULTS = (None, None, None)
_SDPA = torch._C._nn.scaled_dot_product_attention
_SDPA_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
_SDPA_DEFAULTS = (None, None, None, None, 0.0, False)
_SDPA_KW = frozenset({"scale", "enable_gqa"})
ENTRIES = frozenset({*_LINEAR, _SDPA})  # the torch-function entries ``single`` may answer


def _positional(args: tuple[Any, ...], kwargs: dict[str, Any], names: tuple[str, ...], defaults: tuple[Any, ...],
                keyword_only: frozenset[str]) -> tuple[list[Any], dict[str, Any]] | None:
    """The call's arguments in schema order (keyword-only ones apart), or None when something is not understood."""
    if len(args) > len(names) or any(k not in names and k not in keyword_only for k in kwargs):
        return None
    if any(names.index(k) < len(args) for k in kwargs if k in names):
        return None  # given twice: let torch say so
    vals = [args[i] if i < len(args) else kwargs.get(n, defaults[i]) for i, n in enumerate(names)]
    return vals, {k: v for k, v in kwargs.items() if k in keyword_only}


def _agree(ts: list[Any], meta: bool = False) -> bool:
    """Plain virtual tensors on one device label, of one dtype, with no autograd graph to record (``meta``: and no
    real values)."""
    first = ts[0]
    if not isinstance(first, VirtualTensor):
        return False
    dev, dtype = first._td_device, first.dtype
    grad = torch.is_grad_enabled()
    for t in ts:
        if not isinstance(t, VirtualTensor) or type(t).__torch_function__ is not _PLAIN_TF or \
                t._td_device != dev or t.dtype != dtype or (grad and t.requires_grad) or \
                (meta and not t._td_elem.is_meta):
            return False
    return True


def single(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, tuple[Any, ...],
                                                                              dict[str, Any]] | None:
    """``(aten op, args, kwargs)`` to send to dispatch as one op, or None: the call decomposes as before."""
    if not ENABLED or torch._C._get_tracing_state() is not None:  # torch.jit.trace sees only what decomposes
        return None
    if func is _SDPA:
        got = _positional(args, kwargs, _SDPA_NAMES, _SDPA_DEFAULTS, _SDPA_KW)
        if got is None:
            return None
        vals, kw = got
        mask = vals[3]
        ts = vals[:3] if mask is None else [*vals[:3], mask]
        if isinstance(mask, VirtualTensor) and mask.dtype == torch.bool:  # its device agrees, its dtype is its own
            q = vals[0]
            if not isinstance(q, VirtualTensor) or mask._td_device != q._td_device or \
                    type(mask).__torch_function__ is not _PLAIN_TF:
                return None
            ts = vals[:3]
        if not _agree(ts, meta=True):
            return None
        return aten.scaled_dot_product_attention.default, tuple(vals), kw
    if func in _LINEAR and LINEAR:
        got = _positional(args, kwargs, _LINEAR_NAMES, _LINEAR_DEFAULTS, frozenset())
        if got is None:
            return None
        vals, _ = got
        x, w, b = vals
        ts = vals[:2] if b is None else vals
        # ``named`` writes the provenance the decomposition would: known for a weight and bias the model holds
        # (named by path), on a 2-d input or a contiguous 3-d one
        if not _agree(ts) or w._td_path is None or (b is not None and b._td_path is None) or \
                not (x.dim() == 2 or (x.dim() == 3 and x.is_contiguous())):
            return None
        return aten.linear.default, tuple(vals), {}
    return None


class _Part:
    """What ``origin.made_from`` reads of a tensor the decomposition made in between."""

    __slots__ = ("dtype", "_td_device", "_td_path", "_td_origin")

    def __init__(self, like: Any, origin: Any) -> None:
        self.dtype, self._td_device, self._td_path, self._td_origin = like.dtype, like._td_device, None, origin


def named(out: Any, one: tuple[Any, tuple[Any, ...], dict[str, Any]]) -> Any:
    """``out`` of ``single``'s op, its provenance as the decomposed call records it: a linear's result was made by
    ``addmm`` (a bias) or ``mm`` from the input and the weight, and on a 3-d input by the view after it (``view``
    with a bias, ``_unsafe_view`` without: ``at::linear`` flattens, multiplies and unflattens), so a problem a
    linear's result causes reads the same either way. An attention's result is named by the attention."""
    space = current_space()
    if one[0] is not aten.linear.default or not isinstance(out, VirtualTensor) or space is None:
        return out
    x, w, b = one[1]
    running = space.hooks.running()
    op: Any = aten.mm if b is None else aten.addmm  # the op packet, as dispatch names a result's maker
    made = made_from(op, running, [x, w] if b is None else [b, x, w], out.dtype, out._td_device)
    if x.dim() > 2:
        op = aten._unsafe_view if b is None else aten.view
        made = made_from(op, running, [_Part(out, made)], out.dtype, out._td_device)
    out._td_origin = made
    return out
