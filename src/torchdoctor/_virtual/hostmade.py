"""The maker of a model's own tensor that the program made on the CPU inside a run: a buffer registered from
``torch.from_numpy(...)`` (which takes no device and ignores a ``with torch.device("cuda"):`` context), a state dict
filled with ``torch.empty(v.shape)`` and loaded with ``assign=True``. The module-entry check finds the parameter or
buffer on the CPU; the fix is at the line that made it (``device=`` given, a host-data maker moved after it), not a
move of the model's tensor after the fact, which the program's next load or build would undo.

Real tensors keep no record of their own, and ``nn.Parameter(t)`` / ``load_state_dict(assign=True)`` wrap ``t`` in a
new object: the record is kept by the storage the tensors share (``remember``), for this run only (``clear``, when
the next run starts), bounded.
"""

from __future__ import annotations

from typing import Any

import torch

_LIMIT = 4096
# (storage, data pointer, bytes) -> (maker, file:line, whether a default-device context was set when it ran)
_MADE: dict[tuple[int, int, int], tuple[str, str, bool]] = {}


def _key(t: torch.Tensor) -> tuple[int, int, int] | None:
    try:
        s = t.untyped_storage()
        return (s._cdata, s.data_ptr(), s.nbytes())
    except (RuntimeError, NotImplementedError, AttributeError, TypeError):
        return None


def remember(t: Any, made: Any) -> None:
    """A real CPU tensor a factory made at a line of the program (``made.at``) during a run: kept when the
    factory ignored a default-device context (``torch.from_numpy`` under ``with torch.device("cuda"):``) or made it
    outside any module's ``__init__`` (a state dict filled to be loaded with ``assign=True``); a tensor a model's
    ``__init__`` makes on the cpu is moved with the model, which is that fix."""
    op, at = getattr(made, "op", None), getattr(made, "at", None)
    if not at or not isinstance(op, str) or not op.startswith("torch.") or op.startswith("torch.nn.") or \
            type(t) is not torch.Tensor or t.device.type != "cpu" or len(_MADE) >= _LIMIT:
        return
    ctx = _default_device_set()
    if not ctx and _building():  # a model built on the cpu and never moved: its move is the fix, not this line
        return
    key = _key(t)
    if key is not None and key[1]:
        _MADE[key] = (op, at, ctx)


def clear() -> None:
    _MADE.clear()


def recorded() -> bool:
    """Any factory of the program made a tensor this run kept a record of."""
    return bool(_MADE)


def maker(t: Any) -> tuple[str, str, bool] | None:
    """(maker, file:line, context ignored) of the factory that made ``t``'s storage in this run, or None."""
    if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or not _MADE:
        return None
    key = _key(t)
    return _MADE.get(key) if key is not None else None


def maker_note(t: Any) -> str:
    """`` (made by torch.from_numpy at app.py:7, which ignores the torch.device context)`` for a model tensor the
    program made on the CPU in this run; empty when no factory of the program made it."""
    hit = maker(t)
    if hit is None:
        return ""
    op, at, ctx = hit
    return f" (made by {op} at {at}" + (", which ignores the torch.device context)" if ctx else ")")


def _building() -> bool:
    """A module's ``__init__`` is running (the factory builds a model's own tensor, as the model is built)."""
    import sys

    f: Any = sys._getframe(2)
    for _ in range(64):
        if f is None:
            return False
        if f.f_code.co_name == "__init__" and isinstance(f.f_locals.get("self"), torch.nn.Module):
            return True
        f = f.f_back
    return False


def _default_device_set() -> bool:
    try:
        return torch.get_default_device().type != "cpu"
    except Exception:  # an older torch: no context to ignore
        return False
