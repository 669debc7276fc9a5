"""strict's check of ``scaled_dot_product_attention`` before it runs: its C++ code compares the dtypes and devices of
query, key, value and the mask before any aten op is dispatched, so the dispatch mode never sees the call, and a
function mode that would (fix / warn's ``CompositeCheck``) costs a Python hop on every torch call — 4-8 % of a
``generate()`` (``bench/guard.py workloads``), more than strict's whole budget over its gate. So while a strict
session runs, ``torch.nn.functional.scaled_dot_product_attention`` is a thin function that checks its operands
with the strict rules in the thread of a strict session and calls torch's own: a cost only per attention call.
Code that holds torch's function under a name of its own (``from torch.nn.functional import
scaled_dot_product_attention`` at import) reaches torch's check, whose error is explained as any other; so does a
key or value held by an object the forward is handed (a KV cache): the explanation from torch's traceback names the
holder and the program's line that gave it its dtype. Put back when the last strict session ends, unless something
else replaced it since (then ours passes through)."""

from __future__ import annotations

import sys
import threading
from typing import Any

import torch
import torch.nn.functional as F

_SDPA = torch.ops.aten.scaled_dot_product_attention.default
_NAMES = ("query", "key", "value", "attn_mask")
_TORCH = F.scaled_dot_product_attention  # torch's own (a C++ builtin)
_LOCK = threading.Lock()
_SESSIONS: dict[int, list[Any]] = {}  # thread id -> its strict sessions, innermost last
_get_ident = threading.get_ident
_Tensor = torch.Tensor
_compiling = torch.compiler.is_compiling


def checked(*args: Any, **kwargs: Any) -> Any:
    """``scaled_dot_product_attention``, its operands checked first in a thread that runs a strict session."""
    if _compiling():  # traced by torch.compile: torch's own function, nothing else in the graph
        return _TORCH(*args, **kwargs)
    stack = _SESSIONS.get(_get_ident())
    if stack and args and isinstance(args[0], _Tensor):
        found = _problem(stack[-1], args, kwargs)
        if found is not None:
            return found()
    return _TORCH(*args, **kwargs)


checked.__wrapped__ = _TORCH  # type: ignore[attr-defined]


def _problem(session: Any, args: Any, kwargs: Any) -> Any:
    """A call raising the strict session's error for the operands, or None when they agree (or autocast casts them
    alike, or a virtual run checks its own ops)."""
    q = args[0]
    n = len(args)
    head = [args[i] if i < n else kwargs.get(name) for i, name in enumerate(_NAMES)]
    first = (q.dtype, q.device)
    if all(not isinstance(t, _Tensor) or (t.dtype, t.device) == first or (i == 3 and t.dtype == torch.bool
                                                                        and t.device == q.device)
           for i, t in enumerate(head)):
        return None  # the common case: one dtype, one device (a boolean mask on the query's device)
    if torch.is_autocast_enabled(q.device.type) or session.replaying:
        return None
    from torchdoctor._guard.dispatch import _simulating
    from torchdoctor._rules import registry as _rules

    if _simulating():
        return None
    rest = {k: v for k, v in kwargs.items() if k not in _NAMES}
    full = (*head, *args[4:])
    found = _rules.find(_SDPA, full[:4], {}, session.g.profile)
    odd = [t for t in head[1:] if isinstance(t, _Tensor) and t.dtype != q.dtype]
    if not found or odd and _held_above(sys._getframe(2), odd):
        return None
    return lambda: session.on_problem(_TORCH, full, rest, found, schema_op=_SDPA)


def _held_above(frame: Any, odd: list[torch.Tensor]) -> bool:
    """``_held`` in the frame that called attention or one of the four that called it (a library's attention
    function called by the attention module's forward, which is handed the cache)."""
    for _ in range(5):
        if frame is None:
            return False
        if _held(frame, odd):
            return True
        frame = frame.f_back
    return False


def _held(frame: Any, odd: list[torch.Tensor]) -> bool:
    """An odd operand shares its storage with a tensor an object the calling forward is handed (or reads by name)
    holds — a KV cache, a dataclass of tensors: then torch's own check raises it, and the explanation from its
    traceback names the holder, what gave it its dtype and the program's line to fix (``heldarg``), which the
    per-op report cannot read yet."""
    code, loc = frame.f_code, frame.f_locals
    dtypes = {t.dtype for t in odd}  # the operands, and what the frame computed them from (``repeat_kv(keys)``)
    ptrs = {_ptr(t) for t in (*odd, *(v for v in loc.values() if isinstance(v, _Tensor) and v.dtype in dtypes))}
    ptrs.discard(0)
    if not ptrs:
        return False
    seen: set[int] = set()
    glob = frame.f_globals
    top = [*loc.values(), *(v for n in code.co_names[:32] if n not in loc and (v := glob.get(n)) is not None)]
    # the objects it is handed or reads by name (``**kwargs``' among them); never the tensors and the tuples of a
    # call's own arguments
    todo = [x for v in top for x in (v.values() if type(v) is dict else (v,)) if _plain(x)]
    for _ in range(3):  # three objects deep: cache.layers[0].keys
        nxt = []
        for v in todo:
            if id(v) in seen or not (_plain(v) or type(v) in (list, tuple, dict)):
                continue
            seen.add(id(v))
            items = list(v.values()) if type(v) is dict else list(v) if type(v) in (list, tuple) else \
                list(d.values()) if isinstance(d := getattr(v, "__dict__", None), dict) else []
            for x in items[:64]:
                if isinstance(x, _Tensor):
                    if _ptr(x) in ptrs:
                        return True
                elif x is not None:
                    nxt.append(x)
        todo = nxt
    return False


def _plain(v: Any) -> bool:
    """An object of the program's or a library's that holds tensors by attribute (a cache, a dataclass)."""
    return isinstance(getattr(v, "__dict__", None), dict) and not isinstance(v, (torch.nn.Module, _Tensor, type)) \
        and not callable(v) and type(v).__module__ != "builtins" and not hasattr(v, "__file__")


def _ptr(t: torch.Tensor) -> int:
    try:
        return 0 if t.is_meta else int(t.untyped_storage().data_ptr())
    except Exception:  # a tensor without storage (a subclass): never held so
        return 0


def install(session: Any) -> None:
    """``session`` (strict) checks attention calls in its thread from now on."""
    with _LOCK:
        if not any(_SESSIONS.values()) and F.scaled_dot_product_attention is _TORCH:
            # help() on the function while a session runs reads torch's text (given here, not at import: its
            # examples are torch's, on cuda, and no doctest of this module's)
            checked.__doc__ = _TORCH.__doc__
            F.scaled_dot_product_attention = checked
        _SESSIONS.setdefault(_get_ident(), []).append(session)


def uninstall(session: Any) -> None:
    """``session`` ended: the last strict session puts torch's function back (when it is still ours there)."""
    with _LOCK:
        stack = _SESSIONS.get(_get_ident(), [])
        if session in stack:
            stack.remove(session)
        if not stack:
            _SESSIONS.pop(_get_ident(), None)
        if not any(_SESSIONS.values()) and F.scaled_dot_product_attention is checked:
            F.scaled_dot_product_attention = _TORCH
