"""The dtype a factory that takes data (``torch.tensor``, ``as_tensor``, ``asarray``) will give its result when
the call names none: float64 numpy data stays float64, which MPS cannot hold, so a virtual run must know it before
the factory makes its stand-in (the stand-in's own dtype is the same, but the check runs before the call)."""

from __future__ import annotations

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


def factory_call(name: str, dtype: str, said: bool, device: str) -> str:
    """How the call reads: ``torch.tensor(<float64 data>, device='mps:0')`` where the data chose the dtype."""
    if said:
        return f"torch.{name}(dtype={dtype}, device={device!r})"
    return f"torch.{name}(<{dtype} data>, device={device!r}) (pass dtype=torch.float32)"


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
