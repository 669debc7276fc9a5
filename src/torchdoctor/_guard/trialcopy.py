"""Copies for a proof's re-run: ``copy``'s two functions, where ``deepcopy`` shares what cannot be copied.

A proof re-runs a module on a copy, so the program's own module is never changed (a norm's running statistics, a
cast). A module that holds a lock (``threading.Lock`` around its forward), an open file or a handle of a library made
in C cannot be deep-copied ("cannot pickle '_thread.lock' object"), and the proof failed on torchdoctor's own copy,
not on the fix. Here the copy gets a new lock of the same kind (the program's may be held by the forward that failed)
and shares anything else that cannot be copied (a file); its tensors, parameters and submodules are its own.
Used as ``from torchdoctor._guard import trialcopy as copy``.
"""

from __future__ import annotations

import copy as _copy
from typing import Any, TypeVar

T = TypeVar("T")

copy = _copy.copy


def deepcopy(obj: T) -> T:
    """``copy.deepcopy(obj)``; where that fails, a deep copy that shares each attribute of a module (or of the object)
    that cannot be copied by itself."""
    try:
        return _copy.deepcopy(obj)
    except Exception:  # something it holds cannot be copied: shared below
        pass
    import torch

    memo: dict[int, Any] = {}
    owners = list(obj.modules()) if isinstance(obj, torch.nn.Module) else [obj]
    for owner in owners:
        for key, value in list(getattr(owner, "__dict__", {}).items()):
            if key in ("_parameters", "_buffers", "_modules") or isinstance(value, (torch.Tensor, torch.nn.Module)):
                continue
            _locks(value, memo, 3)  # a lock inside an object it holds: a new one too (the object is then copied)
            try:
                _copy.deepcopy(value, dict(memo))
            except Exception:  # a lock: a new one of its kind; an open file: the copy shares it
                memo[id(value)] = _fresh(value)
    return _copy.deepcopy(obj, memo)


def _locks(value: Any, memo: dict[int, Any], depth: int) -> None:
    """Each lock (event, condition) ``value`` holds in its attributes or items, ``depth`` levels down, given a new
    one in ``memo``."""
    if type(value).__module__ in ("_thread", "threading"):
        memo[id(value)] = _fresh(value)
        return
    if depth <= 0:
        return
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple, set)) else \
        getattr(value, "__dict__", {}).values() if not isinstance(value, type) else ()
    for item in list(items)[:256]:
        _locks(item, memo, depth - 1)


def _fresh(value: Any) -> Any:
    """A new lock (event, condition ...) of ``value``'s kind, unheld: the program's may be held by the very forward
    that failed, and the copy's forward would wait for it forever; anything else, ``value`` itself."""
    import threading

    if type(value).__module__ in ("_thread", "threading"):
        try:  # (``_thread.lock`` is made by ``threading.Lock()`` only)
            return threading.Lock() if isinstance(value, type(threading.Lock())) else \
                threading.RLock() if isinstance(value, type(threading.RLock())) else type(value)()
        except Exception:  # a kind that needs arguments: shared
            return value
    return value


__all__ = ["copy", "deepcopy"]
