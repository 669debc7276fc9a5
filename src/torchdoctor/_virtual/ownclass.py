"""A tensor subclass with a ``__torch_function__`` of its own keeps its class through a virtual move, as torch keeps it
on the machine.

The run's function mode answers ``.to`` / ``.cuda()`` / ``.half()`` before a subclass's ``__torch_function__`` would
run, so a library's subclass that re-wraps what torch gives back — diffusers' ``GGUFParameter`` builds a new one with
its ``quant_type`` — came out of a virtual move as a plain virtual tensor, and the library then read its raw bytes as
weights. Here the class's own ``__torch_function__`` runs around the virtual move: torch's default one hands it the
moved tensor already of its class (what its ``as_subclass`` would give), and the class does with it what it does on
the machine.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from torchdoctor._virtual.tensor import VirtualTensor, make, virtual_class

_DEFAULT = (torch.Tensor, torch._C.TensorBase, torch.nn.Parameter)
_OWN: dict[type, Any] = {}  # class -> (its real base, its own __torch_function__) or None; one look per class


def own_function(cls: type) -> tuple[type, Any] | None:
    """``cls``'s program-side class and the ``__torch_function__`` it defines itself, or None (torch's default, or
    the disabled one a ``Parameter`` has)."""
    hit = _OWN.get(cls, _OWN)
    if hit is not _OWN:
        return hit  # type: ignore[no-any-return]
    base = next((c for c in cls.__mro__ if not issubclass(c, VirtualTensor)), torch.Tensor)
    found: tuple[type, Any] | None = None
    if base not in _DEFAULT and issubclass(base, torch.Tensor) and \
            not any("__torch_dispatch__" in c.__dict__ for c in base.__mro__[:-3]):  # (a wrapper subclass: not here)
        for klass in base.__mro__:
            tf = klass.__dict__.get("__torch_function__")
            if tf is not None:
                fn = getattr(tf, "__func__", tf)
                # torch's own (UninitializedParameter's, which refuses any function it does not list: a lazy layer
                # moved before its first call) keep torch's answer, as the run's move already gives it
                if klass not in _DEFAULT and fn is not torch._C._disabled_torch_function_impl and \
                        not klass.__module__.startswith("torch."):
                    found = (base, tf.__get__(None, base))
                break
    _OWN[cls] = found
    return found


class _Plain(Exception):
    """The move's result cannot be given the class (a tensor in the autograd graph): it goes back as it is."""

    def __init__(self, out: Any) -> None:
        super().__init__()
        self.out = out


def keeping(handler: Callable[..., Any]) -> Callable[..., Any]:
    """A move handler of the run's mode that lets the moved tensor's class do its own part (``GGUFParameter``'s
    ``quant_type``), as it does around torch's move on the machine."""

    def handle(space: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        own = own_function(type(args[0])) if args else None
        if own is None:
            return handler(space, func, args, kwargs)
        base, tf = own

        @functools.wraps(func)
        def moved(*a: Any, **k: Any) -> Any:
            out = handler(space, func, a, k)
            if not isinstance(out, VirtualTensor) or isinstance(out, base):
                return out  # (a real cpu result: torch's default converts it to the class itself)
            if out.requires_grad and not out.is_leaf:
                raise _Plain(out)
            kept = make(virtual_class(base), out._td_elem, out._td_device, out._td_path, out.requires_grad)
            kept._td_origin = out._td_origin
            return kept

        try:
            return tf(moved, (base,), args, kwargs)
        except _Plain as plain:
            return plain.out

    return handle
