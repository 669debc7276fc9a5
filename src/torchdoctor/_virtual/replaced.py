"""Parameters ``Module.to`` replaced in a virtual run, and the optimizers that still hold the old ones.

On the real machine ``model.to("cuda")`` keeps each ``Parameter`` object (torch assigns ``param.data``), so an
optimizer, an EMA list or a hook built before the move goes on working. A virtual twin cannot be put inside a real
``Parameter`` (a wrapper's storage-less C++ tensor copied into a plain one crashes the interpreter, and the two
classes' layouts differ, so ``torch.utils.swap_tensors`` refuses them): ``Module._apply`` builds a new ``Parameter``
around the twin. The run records which one it replaced, and before every optimizer step the optimizer's groups and
state are pointed at the parameters the model now holds, as they would be on the device. Its state then meets the
step's checks beside the parameter it belongs to (a state loaded onto the CPU before the move is found there).

A module moved back (a block swap's ``block.to("cpu")`` then ``block.to("cuda")``, an offload hook's round trip) gets
back the very ``Parameter`` object it held there before (``kept``): a twin lives on while the real one that replaced
it on the cpu is in the model, a real one while the program holds it. Only the first move of a real parameter onto a
virtual device makes a new object, so an optimizer, a hook or an ``id(p)`` map made on the device keeps stepping,
firing and naming the parameter the model holds, however often it is swapped (while a block sits on the cpu its
parameters are real tensors: other objects than the twins). Hooks registered on a parameter follow it through every
move, the first included. ``torch.__future__``'s swap flag is answered False to ``Module._apply`` alone (a real
``Parameter`` cannot be swapped with a twin; the object is kept as above, as the swap keeps it on the device); its
overwrite flag gives new objects, as on the device.

Everything else the program does with a replaced ``Parameter`` it still holds (a freeze list taken before the move:
``p.requires_grad_(False)``, ``p.grad``, an in-place update) reaches the one the model holds: for the run the old
object's class is ``Moved``, whose ``__torch_function__`` hands every call to its successor, and it is put back to
``Parameter`` when the run ends. Only identity (``id(p)``, ``p is q``) still tells the two apart.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from torchdoctor._virtual import lifted, tensor as V

_APPLY = torch.nn.Module._apply.__code__


class Moved(torch.nn.Parameter):
    """A ``Parameter`` that ``Module.to`` replaced in the running run (the same layout as ``Parameter``, so its
    class can be switched in place): every torch call, method, getter and setter on it goes to its successor (the
    run's function mode does the same before it handles a call)."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        moved = successors(V.current_space(), args, kwargs, sys._getframe(1))
        if moved is not None:
            return on_successors(func, moved[0], moved[1], func)
        return torch._C._disabled_torch_function_impl(func, types, args, kwargs)


def successors(space: Any, args: Any, kwargs: Any, caller: Any) -> tuple[Any, Any] | None:
    """``args`` and ``kwargs`` with each ``Moved`` parameter replaced by the one the model holds now; None when
    ``caller`` is ``Module._apply`` (which still moves the old one's grad) or one has no successor."""
    if space is None or caller.f_code is _APPLY:
        return None
    args, kwargs = tree_map(lambda a: _now(space, a) if type(a) is Moved else a, (args, kwargs))
    return None if any(type(a) is Moved for a in tree_flatten((args, kwargs))[0]) else (args, kwargs)


def through(space: Any, func: Any, args: Any, kwargs: Any, caller: Any, handle: Any) -> Any:
    """The run's function mode meets a ``Moved`` parameter: ``handle`` (the mode's own handling, given no types)
    takes the call on its successors, or on the parameter itself when it has none."""
    moved = successors(space, args, kwargs, caller)
    if moved is None:
        return handle(func, (), args, kwargs)
    return on_successors(func, moved[0], moved[1], lambda *a, **k: handle(func, (), a, k))


def on_successors(func: Any, args: Any, kwargs: Any, call: Any) -> Any:
    """``func`` run on the successors: an attribute is read or written by name (a twin's ``device`` is a Python
    property the C getter behind ``func`` would bypass); anything else goes to ``call``."""
    name = getattr(func, "__name__", "")
    attr = getattr(getattr(func, "__self__", None), "__name__", None) if name in ("__get__", "__set__") else None
    if attr is None:
        return call(*args, **kwargs)
    if name == "__get__":
        return getattr(args[0], attr)
    setattr(args[0], attr, args[1])
    return None


def _apply_frame(depth: int) -> Any:
    """The ``Module._apply`` frame at most three frames above the caller's caller, or None."""
    frame = sys._getframe(depth)
    for _ in range(3):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            return None
        if frame.f_code is _APPLY:
            return frame
    return None


def kept(space: Any, data: torch.Tensor, requires_grad: bool) -> Any:
    """``Module._apply`` (a frame or two up) is about to build a new ``Parameter`` around ``data`` in place of its
    ``param``: the ``Parameter`` of ``data``'s kind (a real one for the cpu, a twin for a virtual device) the model
    held before in that slot and the program still holds, given ``data`` — on the device ``Module.to`` keeps the
    object — or None (a new one is built, as the first move onto a virtual device must)."""
    frame = _apply_frame(2) if space is not None and space.replaced else None
    if frame is None or not _keeps_objects():
        return None
    old = frame.f_locals.get("param")
    before = getattr(old, "__dict__", {}).get("_td_before")
    if not before:
        return None
    virtual = isinstance(data, V.VirtualTensor)
    kinds = (V.virtual_class(_PARAM),) if virtual else (Moved, _PARAM)
    for ref in reversed(before):
        p = ref()
        if p is None or p is old or type(p) not in kinds:
            continue
        with torch._C.DisableTorchFunction():  # machinery: neither the run's mode nor ``Moved`` may see these
            if p.shape != data.shape:  # (another tensor the program put in that slot)
                continue
            if type(p) is Moved:
                p.__class__ = _PARAM  # type: ignore[assignment]
            p.__dict__.pop("_td_swapped", None)
            if not virtual:
                p.__dict__.pop("_td_device", None)
            p.data = data
            p.grad = None  # ``Module._apply`` gives it the moved one's grad, if it had one
            p.requires_grad_(requires_grad)
        space.replaced.pop(id(p), None)
        return p
    return None


def tied(space: Any, data: torch.Tensor) -> Any:
    """A ``Parameter`` tied between two modules (an LM's embedding and head) that ``Module._apply`` (a frame or two
    up) meets again in the second module, after it built the first one's successor on this device: on the machine
    both modules hold the one object (``.data`` assigned in place), so the second is given that successor; or None."""
    frame = _apply_frame(2) if space is not None and space.replaced else None
    if frame is None or not _keeps_objects():
        return None
    old = frame.f_locals.get("param")
    hit = space.replaced.get(id(old)) if old is not None else None
    new = hit[1]() if hit is not None and hit[0]() is old else None
    if not isinstance(new, torch.Tensor):
        return None
    with torch._C.DisableTorchFunction():  # (a twin the move back left on the cpu is met as ``data`` there)
        same = _where(new) == _where(data) and new.dtype == data.dtype and new.shape == data.shape
    return new if same else None


def _where(t: torch.Tensor) -> torch.device:
    return torch.device(t._td_device) if isinstance(t, V.VirtualTensor) else t.device


_PARAM = torch.nn.Parameter
_HOOKS = ("_backward_hooks", "_post_accumulate_grad_hooks")
_SWAP_FLAG = [torch.__future__.get_swap_module_params_on_conversion]


def _keeps_objects() -> bool:
    """``Module._apply`` keeps each ``Parameter`` object on the device: unless the program asked for new ones
    (``torch.__future__.set_overwrite_module_params_on_conversion(True)``, a swap not asked for)."""
    return bool(_SWAP_FLAG[0]()) or not torch.__future__.get_overwrite_module_params_on_conversion()


def no_swap_in_apply() -> bool:
    """``torch.__future__.get_swap_module_params_on_conversion`` in a virtual run: False to ``Module._apply``, which
    cannot swap a real ``Parameter`` with a virtual twin (their layouts differ, and the run holds weak references to
    both), so it takes the path that keeps the object (``.data =``, or ``kept``), as the swap keeps it on the
    device; the program's own reading of the flag, and any other thread's, is the flag."""
    if sys._getframe(1).f_code is _APPLY and V.current_space() is not None:
        return False
    return bool(_SWAP_FLAG[0]())


def note(space: Any, new: torch.Tensor) -> None:
    """``new`` is the ``Parameter`` that ``Module._apply`` (a frame or two up) builds in place of its ``param``."""
    frame = _apply_frame(2) if space is not None and _keeps_objects() else None  # (else new ones there too)
    old = frame.f_locals.get("param") if frame is not None else None
    if isinstance(old, torch.nn.Parameter) and old is not new:
        succeeded(space, old, new)


def succeeded(space: Any, old: torch.nn.Parameter, new: torch.Tensor) -> None:
    """``new`` stands in the model for ``old`` from now on (``Module.to``, ``torchdoctor.move``); so it does for
    every earlier one still held, which need not reach it through ``old`` (nobody may hold ``old`` any more)."""
    # never keeps either alive, but for a twin a real one replaced: while the model holds ``new`` (the reference
    # lives as long as this entry), it comes back with the module (``kept``) with its id, hooks and attributes
    nref = weakref.ref(new, _holding(old)) if isinstance(old, V.VirtualTensor) and not isinstance(
        new, V.VirtualTensor) else weakref.ref(new)
    space.replaced[id(old)] = (weakref.ref(old), nref)
    with torch._C.DisableTorchFunction():  # (``old`` may be a ``Moved`` already: its own hooks, not its successor's)
        for name in _HOOKS:  # hooks registered on the parameter fire wherever the model's move puts it
            if getattr(new, name) is None and (hooks := getattr(old, name)) is not None:
                setattr(new, name, hooks)  # the same dict: a handle's remove() reaches both
    if type(old) is torch.nn.Parameter:
        old.__class__ = Moved
    for ref in follow(old, new):
        if (t := ref()) is not None:
            space.replaced[id(t)] = (ref, nref)


def _holding(t: Any) -> Any:
    """A weak reference's callback that holds ``t`` (a plain tensor attribute would be walked as the model's)."""
    return lambda _ref: t


def follow(old: Any, new: Any) -> list[Any]:
    """``Module.to`` on the device keeps each ``Parameter`` object and swaps its data, so whatever still holds it
    reads it where it went: a backward whose op saved the parameter itself (``native_layer_norm`` saves its weight,
    a convolution its kernel) reads it after an offload moved it away; a view taken before the move (a linear's
    ``weight.t()``) keeps the old data. The virtual twin ``Module._apply`` replaced (and those it replaced before)
    takes its successor's device."""
    before = [r for r in old.__dict__.get("_td_before", ()) if r() is not None and r() is not new]
    before.append(weakref.ref(old))
    device = new._td_device if isinstance(new, V.VirtualTensor) else new.device
    # (a real one the run replaced hands every call on: ``Moved``)
    lifted.swapped([t for r in before if isinstance(t := r(), V.VirtualTensor)], device)
    new.__dict__["_td_before"] = before
    return before


def _now(space: Any, p: Any) -> Any:
    """What the model holds now in place of ``p`` (through several moves), or ``p`` itself."""
    for _ in range(16):
        hit = space.replaced.get(id(p))
        new = hit[1]() if hit is not None and hit[0]() is p else None
        if new is None:
            return p
        p = new
    return p


def retarget(space: Any, optimizer: Any) -> None:
    """Point ``optimizer``'s parameter groups and state at the parameters that replaced the ones it was built with."""
    if space is None or not space.replaced:
        return
    state = getattr(optimizer, "state", None)
    for group in getattr(optimizer, "param_groups", ()):
        params = group.get("params") if isinstance(group, dict) else None
        if not isinstance(params, list):
            continue
        for i, p in enumerate(params):
            new = _now(space, p)
            if new is p:
                continue
            params[i] = new
            if state is not None and p in state:
                state[new] = state.pop(p)


def end(space: Any) -> None:
    """The run is over: replaced ``Parameter`` objects are plain ones again, real tensors lose their labels."""
    for ref, _ in space.replaced.values():
        old: Any = ref()
        if type(old) is Moved:
            old.__class__ = torch.nn.Parameter  # type: ignore[assignment]
    for ref in space.relabelled:
        t = ref()
        if t is not None:
            t.__dict__.pop("_td_device", None)
