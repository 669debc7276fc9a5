"""The backward pass of a virtual run runs under the run's own mode, as its forward did.

A ``TorchFunctionMode`` is taken off the stack while it handles a call, and autograd's engine keeps the
thread-local state it finds when the pass starts: a ``backward()`` or ``torch.autograd.grad`` handled by the mode
would run its whole pass with no mode at all. Most backward kernels do not care (they dispatch on the virtual
tensors themselves), but a pass that runs Python code of the program does: gradient checkpointing recomputes the
forward inside it, with the autocast state of the forward (``torch.autocast("cuda")`` is the run's emulation, read
by the mode) and with factories and moves to ``"cuda"`` that only the mode places. So the pass is started with the
mode pushed again; torch's own re-dispatch to the mode (``has_torch_function`` in ``torch.autograd``) is answered
"no" for that one call, since the mode has already seen it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.autograd as _autograd

from torchdoctor._virtual.tensor import Space

_ORIG_HAS = _autograd.has_torch_function  # type: ignore[attr-defined]
_LOCK = threading.Lock()
_INSIDE = threading.local()
_DEPTH = [0]


def _has_torch_function(args: Any) -> bool:
    # only the thread that started a pass skips the re-dispatch; any other thread asks torch as before
    return False if getattr(_INSIDE, "on", False) else bool(_ORIG_HAS(args))


@contextlib.contextmanager
def _no_redispatch() -> Iterator[None]:
    with _LOCK:
        if _DEPTH[0] == 0:
            _autograd.has_torch_function = _has_torch_function  # type: ignore[attr-defined]
        _DEPTH[0] += 1
    before = getattr(_INSIDE, "on", False)
    _INSIDE.on = True
    try:
        yield
    finally:
        _INSIDE.on = before
        with _LOCK:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                _autograd.has_torch_function = _ORIG_HAS  # type: ignore[attr-defined]


def _tensor_backward(self: torch.Tensor, gradient: Any = None, retain_graph: Any = None, create_graph: bool = False,
                     inputs: Any = None) -> None:
    _autograd.backward(self, gradient, retain_graph, create_graph, inputs=inputs)


def handlers(mode: Callable[[Space], Any]) -> dict[Any, Callable[..., Any]]:
    """``Tensor.backward``, ``torch.autograd.backward`` and ``torch.autograd.grad`` for the mode ``mode(space)``
    makes: the run's own checks first (a loss on the cpu), then the pass under a fresh push of that mode."""
    from torchdoctor._virtual.training import check_backward

    def under_mode(call: Callable[..., Any]) -> Callable[..., Any]:
        def handler(space: Space, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if func is not _autograd.grad and hasattr(space.hooks, "modules") and args \
                    and isinstance(args[0], torch.Tensor):  # a recorder: the run's own checks
                check_backward(space.hooks, args[0])
            with mode(space), _no_redispatch():
                return call(*args, **kwargs)
        return handler

    from torchdoctor._virtual.datadtype import new_tensor_handlers  # also run again under the mode

    return {torch.Tensor.backward: under_mode(_tensor_backward), _autograd.backward: under_mode(_autograd.backward),
            _autograd.grad: under_mode(_autograd.grad), **new_tensor_handlers(mode)}
