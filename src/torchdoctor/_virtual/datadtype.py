"""The dtype a factory that takes data (``torch.tensor``, ``as_tensor``, ``asarray``) will give its result when
the call names none: float64 numpy data stays float64, which MPS cannot hold, so a virtual run must know it before
the factory makes its stand-in (the stand-in's own dtype is the same, but the check runs before the call)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

DATA_FACTORIES = frozenset({"tensor", "as_tensor", "asarray"})
_LIMIT = 256  # a long list of python numbers says its kind in its first items; never walk a huge one


def data_dtype(name: str, args: tuple[Any, ...]) -> torch.dtype | None:
    """``torch.float64`` for ``torch.tensor(np.linspace(0, 1, 4))``; None where the dtype is not the data's (not a
    data factory, no data) or cannot be told cheaply."""
    if name not in DATA_FACTORIES or not args:
        return None
    return _of(args[0], 0)


def factory_call(name: str, dtype: str, said: bool, device: str, at: str | None = None) -> str:
    """How the call reads: ``torch.tensor(<float64 data>, device='mps:0')`` where the data chose the dtype, a
    tensor's own factory as ``Tensor.new_full(dtype=float64, device='mps:0')``; ``at``: the line that called it."""
    where = f" at {at}" if at else ""
    if said:
        return f"{maker_name(name)}(dtype={dtype}, device={device!r}){where}"
    return f"{maker_name(name)}(<{dtype} data>, device={device!r}){where} (pass dtype=torch.float32)"


def maker_name(name: str) -> str:
    """``torch.zeros``; ``Tensor.new_zeros`` for a tensor's own factories (``x.new_zeros(...)``)."""
    return f"Tensor.{name}" if name.startswith("new_") else f"torch.{name}"


def new_tensor_handlers(mode: Callable[[Any], Any]) -> dict[Any, Callable[..., Any]]:
    """``x.new_tensor(data, dtype=...)`` on a virtual tensor, run as ``torch.tensor`` on ``x``'s device in ``x``'s
    dtype (or the one it names) under a fresh push of the run's mode ``mode(space)``: torch builds it in C++ from
    ``x``'s wrapper, so it would otherwise come back a plain tensor off the device, and a float64 it asks for on
    mps would go unseen."""
    def new_tensor(space: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        this = args[0] if args else None
        device = getattr(this, "_td_device", None)
        if device is None or len(args) > 2 or (len(args) < 2 and "data" not in kwargs):
            return func(*args, **kwargs)
        kw = dict(kwargs)
        data = args[1] if len(args) == 2 else kw.pop("data")
        kw.pop("pin_memory", None)
        dtype = kw.pop("dtype", None) or this.dtype  # type: ignore[union-attr]
        where = kw.pop("device", None) or device
        space.hooks.creating("new_tensor", space.norm(where), {"dtype": dtype})  # named as the program calls it
        with mode(space):
            return torch.tensor(data, dtype=dtype, device=where, **kw)

    return {torch.Tensor.new_tensor: new_tensor}


def _of(data: Any, depth: int) -> torch.dtype | None:
    if isinstance(data, torch.Tensor):
        return data.dtype
    np_dtype = getattr(data, "dtype", None)
    if np_dtype is not None and type(data).__module__.split(".")[0] == "numpy":
        return _numpy(np_dtype)
    if isinstance(data, bool):
        return torch.bool
    if isinstance(data, complex):
        return torch.complex128 if torch.get_default_dtype() == torch.float64 else torch.complex64
    if isinstance(data, float):
        return torch.get_default_dtype()
    if isinstance(data, int):
        return torch.int64
    if isinstance(data, (list, tuple)) and depth < 8:
        kinds = [_of(x, depth + 1) for x in data[:_LIMIT]]
        known = [k for k in kinds if k is not None]
        if not known:
            return None
        return max(known, key=_rank)
    return None


def _rank(dt: torch.dtype) -> tuple[bool, bool, int]:
    return (dt.is_complex, dt.is_floating_point, dt.itemsize)


def _numpy(np_dtype: Any) -> torch.dtype | None:
    try:
        import numpy as np
        return torch.from_numpy(np.empty(0, dtype=np_dtype)).dtype
    except (TypeError, ImportError, RuntimeError):
        return None
