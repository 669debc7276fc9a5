"""Objects built around virtual tensors while a run is active: ``Parameter(virtual)`` and the library subclasses
made with ``Tensor._make_subclass`` (``Params4bit``) stay virtual; the default device a run set is put back."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import torch

from torchdoctor._virtual import replaced, tensor as V
from torchdoctor._virtual.dispatch import lift_all
from torchdoctor._virtual.takenback import TakenBack
from torchdoctor._virtual.tensor import VirtualTensor, make, virtual_class


_ORIG_MAKE_SUBCLASS = torch.Tensor._make_subclass


def make_subclass(cls: type[Any], data: torch.Tensor, requires_grad: bool = False, **kwargs: Any) -> Any:
    """``Parameter`` / ``Params4bit`` built around a virtual tensor stay virtual (the library's ``__new__`` runs)."""
    if isinstance(data, VirtualTensor) or issubclass(cls, VirtualTensor):
        v: VirtualTensor = data if isinstance(data, VirtualTensor) else lift_all([data], V.current_space(), None)[0]
        return make(virtual_class(cls), v._td_elem, v._td_device, v._td_path, requires_grad)
    return _ORIG_MAKE_SUBCLASS(cls, data, requires_grad, **kwargs)  # type: ignore[type-var]


_ORIG_PARAM_NEW = torch.nn.Parameter.__new__


def param_new(cls: type[Any], data: Any = None, requires_grad: bool = True) -> Any:
    """``Parameter(virtual)`` is a (virtual) ``Parameter``, as ``Parameter(tensor)`` is: accelerate's offload hooks
    rebuild weights with ``type(param)(value)``, which a plain tensor with ``_is_param`` cannot do."""
    if isinstance(data, VirtualTensor) and type(data) in (VirtualTensor, virtual_class(torch.nn.Parameter)):
        space = V.current_space()
        tie = replaced.tied(space, data) if cls is torch.nn.Parameter else None
        if tie is not None:  # (the successor the first module of a tied pair got: one object, as on the device)
            return tie
        made = replaced.kept(space, data, requires_grad) if cls is torch.nn.Parameter else None
        if made is None:  # (else the twin the model held on this device before: a round trip keeps the object)
            own = _own_held(data) if cls is torch.nn.Parameter else None
            made = make_subclass(cls if own is None else type(own), data, requires_grad)
            _keep_attributes(made, own)
        replaced.note(V.current_space(), made)  # Module.to's new Parameter: optimizers built before are pointed at it
        return made
    if isinstance(data, VirtualTensor) and isinstance(data, torch.nn.Parameter) and cls is torch.nn.Parameter:
        # Module._apply wraps a moved Params4bit / Int8Params in Parameter(...): a real one detaches to its own class
        # (the library's quant_state stays on it); the virtual twin's detach cannot, so it is kept as it is. Where the
        # library's ``to`` built a new one for a real one the model held, the object the device keeps is that one
        # (torch assigns ``.data``): the twin is given its attributes (Int8Params' CB/SCB as the layer's forward
        # left them, not the fresh ones of the library's copy)
        _keep_attributes(data, _held_before(data))
        if data.requires_grad != requires_grad:  # (a lazy module's uninitialized one refuses a call, even this one)
            with torch._C.DisableTorchFunctionSubclass():
                data.requires_grad_(requires_grad)
        return data
    space = V.current_space() if isinstance(data, torch.Tensor) else None
    twin = _held_before(data) if space is not None and cls is torch.nn.Parameter else None
    if twin is not None:
        # a twin Params4bit / Int8Params that Module.to takes back to the cpu (a layer streamed by module.to): on the
        # device torch assigns ``param.data``, so the object stays with its own attributes (its quant_state, which
        # the library's ``to`` moved in place; Int8Params' CB/SCB as the layer's forward left them). The library's
        # ``to`` has built a real one of its class, which ``Parameter(...)`` refuses (its detach returns a plain
        # tensor): it is the parameter the model holds on the cpu, given the twin's attributes
        _keep_attributes(data, twin)
        if data.requires_grad != requires_grad:
            data.requires_grad_(requires_grad)
        replaced.note(space, data)
        return data
    out = replaced.kept(space, data, requires_grad) if space is not None and cls is torch.nn.Parameter else None
    own = _own_held(data) if out is None and space is not None and cls is torch.nn.Parameter else None
    if own is not None:  # the program's own Parameter subclass taken back to the cpu: its class and attributes
        out = _ORIG_MAKE_SUBCLASS(_real_class(type(own)), data, requires_grad)
        _keep_attributes(out, own)
    elif out is None:  # (else the real one the model held on the cpu before)
        out = _ORIG_PARAM_NEW(cls, data, requires_grad)
    if space is not None and data.device.type == "cpu":
        replaced.note(space, out)  # a virtual one Module.to took to the cpu: what holds the old one reads it there
    kept = space.real_record(data) if space is not None and space.real else None
    if kept is not None and (str(getattr(kept[1], "op", "")).startswith("torch.nn.") or isinstance(kept[1], TakenBack)):
        # a module built in forward (nn.BatchNorm2d(8)(x)): its weight keeps its constructor's line (a Parameter the
        # user builds from a factory is named by makers as a lazily built Parameter); a parameter ``model.cpu()``
        # took to the cpu at the program's line keeps that line
        space.keep_real(out, kept[0], kept[1])  # type: ignore[union-attr]
    return out


def _held_before(data: Any) -> Any:
    """The parameter ``Module._apply`` (the caller of ``param_new``) replaces when it calls ``Parameter(data)`` for a
    library subclass of ``Parameter`` (``Params4bit``, ``Int8Params``) because one side is virtual (torch could not
    assign ``.data`` between them, as it does on the device), or None."""
    if type(data) is torch.nn.Parameter or not isinstance(data, torch.nn.Parameter):
        return None
    frame = sys._getframe(2)  # (this, param_new, its caller)
    held = frame.f_locals.get("param") if frame.f_code is replaced._APPLY else None
    if held is None or held is data:
        return None
    return held if isinstance(data, type(held)) or isinstance(held, type(data)) else None


def _own_held(data: Any) -> Any:
    """The parameter ``Module._apply`` replaces with ``Parameter(data)`` when it is of a ``Parameter`` subclass of its
    own (a user's class with extra attributes, ``GGUFParameter``) and ``data`` is a plain tensor: on the machine torch
    assigns ``.data`` and the object, its class and its attributes, stay; or None."""
    if type(data) not in (torch.Tensor, torch.nn.Parameter, VirtualTensor, virtual_class(torch.nn.Parameter)):
        return None
    frame = sys._getframe(2)  # (this, param_new, its caller)
    held = frame.f_locals.get("param") if frame.f_code is replaced._APPLY else None
    if held is None or held is data or not isinstance(held, torch.nn.Parameter):
        return None
    real = _real_class(type(held))  # (the run's own ``Moved``: a tied weight met again, not the program's class)
    return held if real is not torch.nn.Parameter and not issubclass(real, replaced.Moved) else None


def _real_class(cls: type) -> type:
    """The program's class behind a virtual twin's (``VirtualGGUFParameter`` -> ``GGUFParameter``)."""
    return next((c for c in cls.__mro__ if not issubclass(c, VirtualTensor)), torch.Tensor)


def _keep_attributes(new: Any, old: Any) -> None:
    """``new`` takes ``old``'s own attributes, as the object torch keeps on the device would (the run's own
    ``_td_`` marks stay ``new``'s)."""
    if old is None:
        return
    own = {k: v for k, v in vars(new).items() if k.startswith("_td_")}
    vars(new).clear()
    vars(new).update({k: v for k, v in vars(old).items() if not k.startswith("_td_")}, **own)


def restore_default_device(before: Any) -> None:
    glob = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
    if glob is None or getattr(glob, "device_context", None) is before:
        return
    with contextlib.suppress(Exception):
        torch.set_default_device(None)
        if before is not None:
            torch.set_default_device(before.device)
