"""Saved-tensor hooks (``torch.autograd.graph.saved_tensors_hooks``, ``save_on_cpu``) run under the run's own mode.

Autograd calls a pack hook while it records an op and an unpack hook while the backward pass runs, both from C++:
the first inside the run's handling of the op (its mode is off the stack then), so the hook's ``t.to("cpu")`` of
activation offloading reached dispatch as a plain ``_to_copy`` that kept the virtual device, and an unpack hook that
never moves the copy back (``t.cuda() if torch.cuda.is_available() else t`` on an XPU) went unseen: a false
all-clear. Each hook pushed while a run is on is wrapped so that it runs with the mode on the stack; what the pack
hook moves to the CPU is then a real CPU tensor, named by the hook's line, and the op of the backward pass that
meets it is judged as any other.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from torchdoctor._virtual import tensor as V
from torchdoctor._virtual.origin import LINES, Made, short_at

_AUTOGRAD = torch._C._autograd
_PUSH = _AUTOGRAD._push_saved_tensors_default_hooks
MODE: list[Any] = []  # the run's mode class, given by the runtime (which imports this module, never the other way)


def _mode_on() -> bool:
    if not torch._C._is_torch_function_mode_enabled():
        return False
    from torch.overrides import _get_current_function_mode_stack

    return any(type(m) is MODE[0] for m in _get_current_function_mode_stack()) if MODE else True


@contextlib.contextmanager
def _under_mode(space: Any) -> Iterator[None]:
    if not MODE or _mode_on():
        yield
        return
    with torch._C._EnableTorchFunction(), MODE[0](space):
        yield


def wrap(hook: Callable[[Any], Any], unpack: bool = False) -> Callable[[Any], Any]:
    """``hook`` run under the mode of the run that is on in this thread when it is called. ``unpack``: what it gives
    back on the CPU, having been taken there by the run (the pack hook's copy), is named by the line that returns it."""

    def under_run(x: Any) -> Any:
        space = V.current_space()
        if space is None or getattr(space, "closed", False):
            return hook(x)
        with _under_mode(space):
            if not unpack:
                return hook(x)
            with _returned(hook) as line:
                out = hook(x)
        return _given_back(space, hook, out, line[0] if line else None)

    under_run.__wrapped__ = hook  # type: ignore[attr-defined]
    return under_run


@contextlib.contextmanager
def _returned(hook: Any) -> Iterator[list[Any]]:
    """The frame of ``hook`` as it returns (its line), caught by a profile function for the one call."""
    code, before = getattr(hook, "__code__", None), sys.getprofile()
    seen: list[Any] = []

    def watch(frame: Any, event: str, arg: Any) -> None:
        if event == "return" and frame.f_code is code:
            seen[:] = [frame]

    if code is None or before is not None:  # a profiler of the program's own is left alone
        yield []
        return
    sys.setprofile(watch)
    try:
        yield seen
    finally:
        sys.setprofile(before)


def _given_back(space: Any, hook: Any, out: Any, frame: Any) -> Any:
    """``out`` as the backward pass gets it: a CPU copy the run took back from a device becomes a virtual CPU tensor
    made by the unpack hook (autograd rewraps a saved output and views it: a real tensor's record would be lost)."""
    if not isinstance(out, torch.Tensor) or isinstance(out, V.VirtualTensor) or out.device.type != "cpu":
        return out
    kept = space.real_record(out)
    if kept is None or not isinstance(kept[1], Made):  # not a tensor the run took back from a device
        return out
    packed, name = kept[1], getattr(hook, "__qualname__", "unpack")
    at = short_at(frame) if frame is not None else None
    if at is not None:
        LINES.setdefault(at, (frame.f_code.co_filename, frame.f_lineno))
    made = Made("Tensor.to", packed.module)
    made.at = at or packed.at  # the hook's line is where it is fixed; the weight it copied was never moved
    what = f"the copy of {kept[0]}" if kept[0] else "the activation"
    made.hook = (f"the saved-tensor unpack hook `{name}`{f' at {at}' if at else ''} (it gives back on cpu {what} that "
                 f"the pack hook took there with {packed.op}{f' at {packed.at}' if packed.at else ''})")
    with torch._C.DisableTorchFunction():
        back = V.make(V.VirtualTensor, space.inner_of(out), out.device)
    back._td_origin = made
    return back


def _push(pack: Callable[[Any], Any], unpack: Callable[[Any], Any]) -> None:
    _PUSH(wrap(pack), wrap(unpack, unpack=True))  # in a thread a run is on (``Installs.set``: others get torch's)


def install(installs: Any, mode: Any) -> None:
    """Hooks pushed while the run is on (``with saved_tensors_hooks(pack, unpack):`` in a forward) run under it."""
    MODE[:] = [mode]
    installs.set(_AUTOGRAD, "_push_saved_tensors_default_hooks", _push)
