"""The one walker: every tensor reachable from an object, with the dotted path a user would type.

``walker`` walks (modules, attributes, containers, tensor-attached state); ``entry`` holds what a walk returns
(``Entry``, ``Walk``) and how a replacement is put back (``set_tensor``); ``kept`` (``kept_walk``: a module tree's
walk kept and reused while flat re-reads prove it unchanged); ``kinds`` reads each kind of object and
tensor form (nested, sparse, quantized, DTensor, wrapper subclasses) without running user code.

The names load with their first use (PEP 562): importing ``kinds`` alone (``_trace`` at a program's start) does not
load the walker and the report types it builds on.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchdoctor._walk.entry import Entry, Walk, set_tensor
    from torchdoctor._walk.kept import kept_walk
    from torchdoctor._walk.kinds import describe, form_of, is_jagged_type
    from torchdoctor._walk.walker import MAX_DEPTH, MAX_ITEMS, MAX_NODES, hook_chain, is_quant_type, walk

_NAMES = {"Entry": "entry", "Walk": "entry", "set_tensor": "entry", "describe": "kinds", "form_of": "kinds",
          "is_jagged_type": "kinds", "kept_walk": "kept", "MAX_DEPTH": "walker", "MAX_ITEMS": "walker", "MAX_NODES": "walker",
          "hook_chain": "walker", "is_quant_type": "walker", "walk": "walker",
          "_is_quant_type": "walker"}  # the name ``torchdoctor._move.owners`` imported before it was public

__all__ = ["MAX_DEPTH", "MAX_ITEMS", "MAX_NODES", "Entry", "Walk", "describe", "form_of", "hook_chain", "is_jagged_type",
           "is_quant_type", "kept_walk", "set_tensor", "walk"]


def __getattr__(name: str) -> Any:
    mod = _NAMES.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name.lstrip("_"))
    globals()[name] = value
    return value
