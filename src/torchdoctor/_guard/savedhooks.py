"""Saved-tensor hooks (``torch.autograd.graph.saved_tensors_hooks``) inside a guarded run: what an unpack hook gives
back is an operand of the backward pass, made by the hook, not by any module. Activation offloading that moves a
saved tensor to the CPU and brings it back only with ``.cuda()`` when CUDA is there leaves it on the CPU on an XPU:
the backward meets ``xpu:0`` and ``cpu`` (hunt U13). Each pair of hooks entered while a session is on in this thread
is pushed wrapped: the pack side keeps where and in which dtype the tensor was saved, the unpack side compares what
the hook gives back with it. strict raises there, naming the hook and its line as the maker; fix aligns it (moved or
cast back) and warn does too, with a warning; explain warns and leaves it (the program's own backward then fails
as it would). The class's ``__enter__`` is patched while a session is on and put back when the last one stops."""

from __future__ import annotations

import ast
import inspect
import os
import textwrap
import threading
import warnings
from typing import Any

import torch

_HOOKS = torch.autograd.graph.saved_tensors_hooks
_ON: list[Any] = []  # the sessions that patched, oldest first
_ORIGINAL: list[Any] = []
_TORCH_ENTER = _HOOKS.__enter__


_LOCK = threading.Lock()  # sessions of several threads start and stop at once


def install(session: Any) -> None:
    with _LOCK:
        if not _ON and _HOOKS.__dict__.get("__enter__") is not _enter:
            _ORIGINAL[:] = [_HOOKS.__dict__.get("__enter__")]
            _HOOKS.__enter__ = _enter  # type: ignore[method-assign]
        _ON.append(session)


def uninstall(session: Any) -> None:
    with _LOCK:
        if session in _ON:
            _ON.remove(session)
        if not _ON and _ORIGINAL:
            if _HOOKS.__dict__.get("__enter__") is _enter:
                _HOOKS.__enter__ = _ORIGINAL[0]  # type: ignore[method-assign]
            _ORIGINAL.clear()


def _enter(self: Any) -> None:
    me = threading.get_ident()
    session = next((s for s in reversed(_ON) if s.tid == me), None)
    if session is None:
        return (_ORIGINAL or [_TORCH_ENTER])[0](self)  # type: ignore[no-any-return]
    pack, unpack = self.pack_hook, self.unpack_hook
    torch._C._autograd._push_saved_tensors_default_hooks(
        _Hook(lambda t: _Saved(t, pack(t)), pack),
        _Hook(lambda p: _unpacked(session, p, unpack) if type(p) is _Saved else unpack(p), unpack))
    return None


class _Hook:
    """One of the program's hooks, checked: it carries the program's hook's name and code, so that a virtual run
    that wraps it too (``_virtual/saved.py``) names the program's hook and the line it returns from."""

    def __init__(self, call: Any, theirs: Any) -> None:
        self.call, self.__wrapped__ = call, theirs
        self.__qualname__ = getattr(theirs, "__qualname__", type(theirs).__name__)
        self.__code__ = getattr(theirs, "__code__", None)

    def __call__(self, x: Any) -> Any:
        return self.call(x)


class _Saved:
    __slots__ = ("device", "dtype", "shape", "inner")

    def __init__(self, t: torch.Tensor, inner: Any) -> None:
        from torchdoctor._rules import registry as _rules

        self.device, self.dtype, self.shape, self.inner = _rules._norm(_rules.tensor_device(t)), t.dtype, \
            tuple(t.shape), inner


def _unpacked(session: Any, p: _Saved, unpack: Any) -> Any:
    out = unpack(p.inner)
    if not isinstance(out, torch.Tensor) or session.replaying:
        return out
    from torchdoctor._rules import registry as _rules

    dev = _rules._norm(_rules.tensor_device(out))
    if dev == p.device and out.dtype == p.dtype:
        return out
    err = _report(session, p, out, dev, unpack)
    session.g._record_problems(list(err.problems))
    if session.mode == "strict":
        raise err
    if session.g._first_time(("saved", getattr(unpack, "__qualname__", ""), str(dev), out.dtype)) and \
            session.mode != "fix":
        from torchdoctor._report.model import PlacementWarning
        from torchdoctor._report.text import user_stacklevel

        warnings.warn(f"torchdoctor.guard: {err}", PlacementWarning, stacklevel=user_stacklevel())
    return out if session.mode == "explain" else out.to(device=p.device, dtype=p.dtype)


def returns_line(fn: Any) -> tuple[str, int, str] | None:
    """(file, line, source) of the one ``return`` statement of ``fn`` (read from its source; nothing is run)."""
    try:
        lines, first = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return None
    rets = [n for n in ast.walk(tree) if isinstance(n, ast.Return)]
    if len(rets) != 1:
        return None
    at = rets[0].lineno
    return inspect.getsourcefile(fn) or "", first + at - 1, lines[at - 1].strip()


def _report(session: Any, p: _Saved, out: torch.Tensor, dev: Any, unpack: Any) -> Any:
    from torchdoctor._placement import compact, device_str, dtype_str
    from torchdoctor._guard.maps import value_code
    from torchdoctor._guard.remedy import with_patch
    from torchdoctor._report.model import PlacementError, Problem
    from torchdoctor._report.text import format_error
    from torchdoctor._rules import registry as _rules

    kind = "device" if dev != p.device else "dtype"
    was, got = (device_str(p.device), device_str(dev)) if kind == "device" else (dtype_str(p.dtype),
                                                                                 dtype_str(out.dtype))
    name = getattr(unpack, "__qualname__", type(unpack).__name__)
    ret = returns_line(unpack)
    at = f" at {os.path.basename(ret[0])}:{ret[1]}" if ret else ""
    on = "on" if kind == "device" else "in"
    head = (f"{kind} problem during backward: the saved-tensor unpack hook `{name}`{at} gives back {on} {got} a tensor "
            f"saved {on} {was}")
    mod = session.frames.bw[-1] if session.frames.bw else None
    lines = [f"culprit: `{name}`{at}" + (f" (`{ret[2]}`)" if ret else "") + f" returns {_rules._compact(out)}; "
             f"it was saved as {compact(p.dtype, p.shape, p.device)}" +
             (f" in the backward of {type(mod).__name__}" if mod is not None else ""),
             f"the backward op that reads it meets {was} and {got}",
             "fix unproven: the backward is not re-run here (guard's fix mode runs it with the tensor put back)"]
    target = f"t.to({repr(device_str(p.device)) if kind == 'device' else value_code(p.dtype)})"
    fix = (f"# make `{name}`{at} give the tensor back where it was saved: keep its device in the pack hook "
           f"(`return t.device, t.to('cpu')`) and return `t.to(device)` from the unpack hook (here {target})"
           if kind == "device" else f"# make `{name}`{at} give the tensor back in the dtype it was saved in ({target})")
    problem = Problem(kind, f"saved tensor unpacked by {name}", "input", got, was,
                      f"the unpack hook `{name}`{at} gives back {on} {got} a tensor saved {on} {was}")
    err = PlacementError(format_error(head, lines, fix), module_path=None, module_type=None, op=None,
                         problems=[problem], fix=fix)
    return with_patch(err, None, lines)
