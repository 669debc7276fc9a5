"""A tensor a library moved on the program's behalf (an offloaded KV cache layer's ``keys``, moved to the cpu by
``DynamicLayer.offload``) named as the program holds it: ``cache.layers[1].keys`` of the cache the program built and
passed to ``generate``, not "a tensor made by Tensor.to at transformers/cache_utils.py:75". When the holder's class
is the program's own subclass of a library class, the methods it overrides are kept with their lines (the program's
``prefetch`` that brings offloaded layers back), for the fix to name. Asked only when a problem is recorded."""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any

import torch

__all__ = ["HELD", "held_deep", "library_move", "overrides_of"]

_SKIP = ("site-packages", "dist-packages", "/torch/", "/torchdoctor/", "<frozen")
_MAX_ITEMS = 256  # a list longer than this is not searched (a courtesy, never a cost)
_PLAIN = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type, torch.nn.Module, torch.Tensor)
_Over = tuple[str, str, tuple[tuple[str, int, int], ...]]  # class qualname, file, ((method, first, last line), ...)
# "holder path" -> (the library's move ``file:line``, the holder has a ``.to``, its class's overrides): this run's
HELD: dict[str, tuple[str, bool, _Over | None]] = {}


def library_move(origin: Any) -> bool:
    """A move a library's own line made (an offloaded cache layer's ``keys.to("cpu")`` in transformers): the program
    holds the moved tensor in an object of its own (``cache.layers[1].keys``)."""
    at = getattr(origin, "at", None)
    if getattr(origin, "op", None) not in ("Tensor.to", "Tensor.cpu") or not at:
        return False
    # the run's line table, read where it is (this module is imported by the tensor machinery origin itself uses)
    lines = getattr(sys.modules.get("torchdoctor._virtual.origin"), "LINES", None) or {}
    file = lines.get(at, ("", 0))[0]
    return bool(file) and any(s in file for s in _SKIP)


def held_deep(t: Any, origin: Any = None) -> str | None:
    """``cache.layers[1].keys``: ``t`` as a plain object in the program's own frames (innermost first) holds it,
    through one container and two attributes at most; None when no object there does. ``origin``: the record of the
    library's move that made it, kept with the path for the fix."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        if not any(s in frame.f_code.co_filename for s in _SKIP):
            for local, obj in list(frame.f_locals.items()):
                if local.startswith("__") or local == "self" or isinstance(obj, _PLAIN):
                    continue
                hit = _inside(obj, t, 2)
                if hit is not None:
                    path = f"{local}{hit}"
                    at = getattr(origin, "at", None)
                    if at and len(HELD) < 256:
                        HELD[path] = (at, callable(getattr(obj, "to", None)), overrides_of(type(obj)))
                    return path
        frame = frame.f_back
    return None


def _inside(obj: Any, t: Any, depth: int) -> str | None:
    """``.layers[1].keys``: where ``obj`` holds ``t`` (an attribute, an item of a list attribute, and that item's
    attribute), ``depth`` attributes deep."""
    attrs = getattr(obj, "__dict__", None)
    if depth <= 0 or not isinstance(attrs, dict) or isinstance(obj, _PLAIN):
        return None
    for name, value in list(attrs.items()):
        if value is t:
            return f".{name}"
        if isinstance(value, (list, tuple)) and len(value) <= _MAX_ITEMS:
            for i, item in enumerate(value):
                if item is t:
                    return f".{name}[{i}]"
                if not isinstance(item, _PLAIN) and (deeper := _inside(item, t, depth - 1)) is not None:
                    return f".{name}[{i}]{deeper}"
    return None


def overrides_of(cls: type) -> _Over | None:
    """The methods ``cls`` — a class of the program's own file — defines over a library base class that has them
    too, with their lines; None for a library's class or one that overrides nothing."""
    from torchdoctor._guard.ownfile import own_file

    try:
        file = inspect.getsourcefile(cls) or ""
    except (TypeError, OSError):
        return None
    if not file or not own_file(file):
        return None
    bases = [b for b in cls.__mro__[1:] if b is not object]
    out: list[tuple[str, int, int]] = []
    for name, fn in vars(cls).items():
        if not isinstance(fn, types.FunctionType) or name.startswith("__") or \
                not any(name in vars(b) for b in bases):
            continue
        try:
            lines, first = inspect.getsourcelines(fn)
        except (OSError, TypeError):
            continue
        out.append((name, first, first + len(lines) - 1))
    return (cls.__qualname__, file, tuple(out)) if out else None

