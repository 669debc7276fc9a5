"""Where a virtual run meets what was made outside it: tensors built before the run (a pytest fixture's model moved
inside ``@pytest.mark.simulate``), and code compiled before it."""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from torchdoctor._virtual import lifted
from torchdoctor._virtual.dispatch import plain
from torchdoctor._virtual.tensor import Space, VirtualTensor


_LABELLED = {"device": lambda d: d, "is_cuda": lambda d: d.type == "cuda", "is_xpu": lambda d: d.type == "xpu",
             "is_mps": lambda d: d.type == "mps", "is_cpu": lambda d: d.type == "cpu"}


def attribute(space: Space, func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A tensor attribute read or written (``__get__`` / ``__set__``): on the object itself, never on a copy."""
    owner = getattr(func, "__self__", None)
    attr = getattr(owner, "__name__", "")
    if not attr and isinstance(owner, property) and owner is vars(torch.Tensor).get("data"):
        attr = "data"  # ``Tensor.data`` replaced by a Python property (a trace watching ``.data =``): still data
    if attr == "data" and name == "__set__" and len(args) == 2 and plain(args[0]):
        if isinstance(args[1], VirtualTensor):
            return _relabel(space, args[0], args[1])
        if "_td_device" in args[0].__dict__:  # a labelled tensor given real data again (an offload hook's
            out = func(*args, **kwargs)  # ``p.data = p.data.to("cpu")``): it is where that data is
            label = getattr(args[1], "__dict__", {}).get("_td_device")
            if label is None:
                del args[0].__dict__["_td_device"]
            else:
                args[0].__dict__["_td_device"] = label
            lifted.follow(args[0], label if label is not None else args[1].device)  # what a backward saved of it
            return out
    if name == "__get__" and attr in ("grad", "data") and args and plain(args[0]) and "_td_device" in args[0].__dict__:
        return _grad_of(space, args[0], func(*args, **kwargs))  # (its ``.data``: the same data, where it is)
    if name == "__get__" and attr in _LABELLED and args and plain(args[0]):
        label = args[0].__dict__.get("_td_device")
        if label is not None:
            return _LABELLED[attr](label)
    return func(*args, **kwargs)


def _grad_of(space: Space, t: torch.Tensor, grad: Any) -> Any:
    """The gradient (or ``.data``) of a real tensor that carries a device label (``p.data = p.data.to("cuda")``): on
    the device it is where its tensor is (torch refuses any other gradient), so it carries the same label; autograd,
    which runs on the real data, made it on the cpu, and ``.data`` is a new tensor object without the label."""
    label = t.__dict__["_td_device"]
    if isinstance(grad, torch.Tensor) and plain(grad) and "_td_device" not in grad.__dict__ and grad.device != label:
        grad.__dict__["_td_device"] = label
        space.relabelled.append(weakref.ref(grad))
    return grad


def _relabel(space: Space, t: torch.Tensor, v: VirtualTensor) -> None:
    """``real.data = virtual`` (``p.data = p.data.to("cuda:1")`` on a tensor made before the run): a real tensor
    cannot become a twin, and sharing the twin's storage-less C++ tensor crashes the interpreter; it takes the
    twin's values and its device label for the rest of the run (the label goes when the run ends)."""
    elem: torch.Tensor | None = v._td_elem
    with torch._C.DisableTorchFunction():
        if elem is not None and elem.device.type == "meta":  # values are never read in a meta run
            elem = None if elem.dtype == t.dtype and elem.shape == t.shape else \
                torch.zeros(elem.shape, dtype=elem.dtype)
        if elem is not None:
            t.data = elem
    t.__dict__["_td_device"] = v._td_device
    lifted.follow(t, v._td_device)
    space.relabelled.append(weakref.ref(t))


_ORIG_COMPATIBLE = torch._has_compatible_shallow_copy_type


def compatible(input: Any, from_: Any) -> bool:  # noqa: A002 - torch's own parameter names
    """``Module.to`` of a model built before the run: a real parameter and its virtual twin must not share one
    C++ tensor (with ``data="cpu"`` torch would call them compatible and copy the twin's storage-less impl into
    the real ``Parameter``, which then crashes the interpreter); ``Module._apply`` makes a new ``Parameter``.
    The parameter names are torch's: dynamo, when first imported during a run, checks that the function it
    replaces in graphs has the signature of its stand-in, and a mismatch leaves it half-imported for good."""
    if isinstance(input, VirtualTensor) is not isinstance(from_, VirtualTensor):
        return False
    return bool(_ORIG_COMPATIBLE(input, from_))


def eager(model: Any = None, **kwargs: Any) -> Any:
    """``torch.compile`` while simulating: the model itself (also as ``@torch.compile(...)``)."""
    return model if model is not None else (lambda fn: fn)


_EAGER_LOCK = threading.Lock()
_EAGER: list[Any] = [0, None]  # runs (any thread) that hold the eager stance; how to restore the stance before


@contextlib.contextmanager
def compiled_run_eagerly(had_dynamo: bool) -> Iterator[None]:
    """Code compiled before the run (``torch.compile(model)`` then ``simulate``) runs as eager code: dynamo would
    trace the run's own hooks and the virtual tensors, and inductor needs the hardware. The compiler's stance is
    process-wide, so runs in several threads share it: the first to start sets it, the last to end restores it.
    Nothing compiled (dynamo never imported), nothing to do."""
    if not had_dynamo:
        yield
        return
    with _EAGER_LOCK:
        if _EAGER[0] == 0:
            _EAGER[1] = _eager_stance()
        _EAGER[0] += 1
    try:
        yield
    finally:
        with _EAGER_LOCK:
            _EAGER[0] -= 1
            restore, _EAGER[1] = (_EAGER[1], None) if _EAGER[0] == 0 else (None, _EAGER[1])
        if restore is not None:
            with contextlib.suppress(Exception):
                restore.__exit__(None, None, None)


def _eager_stance() -> Any:
    """Enter ``force_eager`` (torch >= 2.6; dynamo's off switch before); the entered object, or None."""
    stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    try:
        if stance is not None:
            return stance("force_eager")  # set now; its __exit__ restores the stance before
        patch = sys.modules["torch._dynamo"].config.patch(disable=True)
        patch.__enter__()
        return patch
    except Exception:  # inside a compiled region, or no dynamo: leave the compiler alone
        return None
