"""The tensors the caller passes to the outermost ``forward`` of a virtual run, named as the forward sees them
(``input_ids``, ``extra[0]``, ``kwargs['rotary_pos_emb_list'][0]``) and as the caller wrote them for a fix
(``kwarg extra[0]``), with where each was made: the source of everything made from them (``entry.EntryCheck.call``)."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from torchdoctor._placement import dtype_str, tensor_device
from torchdoctor._virtual.origin import Made
from torchdoctor._virtual.tensor import Space, VirtualTensor, make


_SIGNATURES: dict[Any, tuple[tuple[str, ...], str | None]] = {}


def signature_of(mod: nn.Module) -> tuple[tuple[str, ...], str | None]:
    """(names of the forward's positional parameters, name of its ``**kwargs`` or None), once per function."""
    fn = mod.forward
    key = getattr(fn, "__func__", fn)
    hit = _SIGNATURES.get(key)
    if hit is None:
        params = inspect.signature(fn).parameters.values()
        pos = tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
        varkw = next((p.name for p in params if p.kind == p.VAR_KEYWORD), None)
        hit = _SIGNATURES[key] = (pos, varkw)
    return hit


def named(space: Space, v: Any, label: str, fix: str, who: str, depth: int, suffix: bool = False,
           index: str = "", makers: dict[str, tuple[str, str, str]] | None = None) -> Any:
    """``v`` with its tensors named as arguments of the call (``fix`` holds ``{}`` where the label or, with
    ``suffix``, the container index goes); a container is rebuilt only when a tensor in it is replaced."""
    if isinstance(v, torch.Tensor):
        return _as_argument(space, v, label + index, fix.format(index if suffix else label + index), who, makers)
    if depth and type(v) in (list, tuple):
        items = [named(space, x, label, fix, who, depth - 1, suffix, f"{index}[{i}]", makers)
                 for i, x in enumerate(v[:64])]
        return v if all(a is b for a, b in zip(items, v)) else type(v)([*items, *v[64:]])
    if depth and type(v) is dict:
        new = {k: named(space, x, label, fix, who, depth - 1, suffix, f"{index}[{k!r}]", makers) if n < 64 else x
               for n, (k, x) in enumerate(v.items())}
        return v if all(new[k] is x for k, x in v.items()) else new
    return v


_MOVES = frozenset({"Tensor.to", "Tensor.cuda", "Tensor.cpu", "Tensor.xpu", "Tensor.mps", "Tensor.type",
                    "Tensor.float", "Tensor.half", "Tensor.double", "Tensor.bfloat16"})


def _maker_op(op: str) -> bool:
    """A factory (``torch.zeros``) or an op that made a new tensor at the caller's line (``Tensor.cat`` of parked
    conditioning); a move or cast carries its operand's maker and is not one."""
    return op.startswith("torch.") or (op.startswith("Tensor.") and op not in _MOVES)


def _cast_outside(src: Made) -> bool:
    """``src`` is a cast at a line of the program outside any model (``net(x.to(device, dtype=weight_dtype))``):
    the argument is still named as the caller's, made by that cast."""
    return src.site is not None and src.module is None and src.at is not None


def _as_argument(space: Space, t: torch.Tensor, label: str, fix: str, who: str,
                 makers: dict[str, tuple[str, str, str]] | None = None) -> torch.Tensor:
    if isinstance(t, VirtualTensor):
        origin = t._td_origin
        # a model tensor, an input simulate placed ("input 0"), a value made from model tensors or named already
        if t._td_path is not None or (origin is not None and (origin.arg or origin.source.arg or origin.source.paths
                                                               and not _cast_outside(origin.source))):
            return t
        src = origin.source if origin is not None else None
        # still on cpu from a factory the user called without device=: the fix is at that call; moved since (or
        # made with a device), the fix is the argument itself
        at_factory = src is not None and src.at and src.op.startswith("torch.") and t._td_device.type == "cpu"
        if makers is not None and src is not None and src.at and _maker_op(str(src.op)):
            makers[fix] = (str(src.op), src.at, dtype_str(t.dtype))  # the factory the caller's argument came from
        # cast at the program's line as it was moved (``x.to(device, dtype=weight_dtype)``): that line chose its
        # dtype, which is fixed there; its device stays the argument's own
        # (still on the cpu it is passed as it is, moved and cast in one ``.to``)
        cast = src if src is not None and _cast_outside(src) and not at_factory and t._td_device.type != "cpu" else None
        t._td_origin = Made.argument(label, fix, who, src or _IN_RUN, origin if at_factory else None, cast)
        return t
    hit = space.named.get(id(t))
    if type(t) is not torch.Tensor or (hit is not None and hit[0] is t and not hit[1].startswith(("input ", "kwarg "))):
        return t  # a Parameter or library subclass passed in, or a model tensor an entry check named
    twin: VirtualTensor = make(VirtualTensor, space.inner_of(t), tensor_device(t))  # new per call: it may change
    if t.requires_grad and torch.is_grad_enabled():  # still in the program's graph: x.grad as on the CPU
        from torchdoctor._virtual.host import through_autograd

        twin = through_autograd(t, twin)
    kept = space.real_record(t) if space.real else None  # a real tensor the run made (a factory call, a copy back)
    if kept is not None and kept[1] is not None:
        twin._td_origin = kept[1]
        return _as_argument(space, twin, label, fix, who, makers)
    twin._td_origin = Made.argument(label, fix, who, None)
    space.named[id(t)] = (t, fix)  # if the call's positional arguments cannot be replaced, ops still name it
    return twin


# containers of the caller's arguments are named this deep (``kwargs['extra']['a'][0]``), 64 items each
DEPTH = 4
_IN_RUN = Made("argument", None, ("",))  # a tensor made in the run without a recorded factory
