"""The virtual copy ``simulate`` works on: a deep copy of the user's object in which each tensor is a virtual twin
(no weight bytes copied, nothing mutable shared), closures copied with their cells so hook chains act on the copy."""

from __future__ import annotations

import collections
import copy
import threading
import types
import weakref
from typing import Any

import torch

from torchdoctor._virtual.tensor import Space, make, unsupported_form, virtual_class


# process state held by user objects: the copy shares it rather than failing to copy it
_SHARED = (type(threading.Lock()), type(threading.RLock()), threading.Thread, threading.Event, threading.Condition,
           types.ModuleType)
_COPYING: set[int] = set()  # threads inside virtual_copy (the deepcopy dispatch table is process-wide)
_SAVED: dict[type, Any] = {}  # the table's entries before the first of them started
_COPY_LOCK = threading.Lock()


def _copy_function(f: types.FunctionType, memo: dict[int, Any]) -> Any:
    """A closure copied with its cells: hook chains that replace ``module.forward`` with a closure over the module
    and the next forward (diffusers' ``HookRegistry``: layerwise casting, group offloading) would otherwise run the
    user's modules and hooks from inside the copy, and cast or move the user's weights. What cannot be copied is
    shared, as deepcopy's own ``functools.partial`` support would fail on it."""
    cells = f.__closure__
    if not cells or threading.get_ident() not in _COPYING:
        return f
    new_cells = tuple(types.CellType() for _ in cells)
    g = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, new_cells)
    g.__kwdefaults__, g.__qualname__ = f.__kwdefaults__, f.__qualname__
    g.__dict__.update(f.__dict__)
    memo[id(f)] = g  # before the cells: a closure may reach itself
    for old, new in zip(cells, new_cells):
        try:
            value = old.cell_contents
        except ValueError:  # an empty cell (a name assigned later in the enclosing function)
            continue
        try:
            new.cell_contents = copy.deepcopy(value, memo)
        except Exception:
            new.cell_contents = value
    return g


def _copy_ordered_dict(x: Any, memo: dict[int, Any]) -> Any:
    """A plain ``OrderedDict`` copied as ``deepcopy`` would, without its reduce round trip: a module holds eleven
    (its hook tables), most of them empty, and these were a third of copying a large model."""
    if vars(x):  # attributes set on the instance: the general path keeps them
        return copy._reconstruct(x, memo, *x.__reduce_ex__(4))  # type: ignore[attr-defined]
    y: collections.OrderedDict[Any, Any] = collections.OrderedDict()
    memo[id(x)] = y
    deep, atomic = _deep, _ATOMIC
    for k, v in x.items():
        y[k if type(k) in atomic else deep(k, memo)] = v if type(v) in atomic else deep(v, memo)
    return y


# what ``copy.deepcopy`` returns as it is (its own atomic types; functions are copied here, see above): a module's
# ``__dict__`` is mostly these, and a deepcopy call for each was a third of the copy's calls
_ATOMIC = frozenset({type(None), int, float, bool, complex, bytes, str, types.CodeType, type, range,
                     types.BuiltinFunctionType, weakref.ref, property, type(Ellipsis), type(NotImplemented)})


_NIL = object()


def _deep(x: Any, memo: dict[int, Any]) -> Any:
    """``copy.deepcopy(x, memo)`` of a value an object holds; the dicts, lists and sets of a module's ``__dict__`` (its
    eleven hook tables) go straight to their copier, past deepcopy's dispatch and keep-alive list (what the copied
    object holds stays alive with it; the list is for temporaries a ``__reduce__`` makes)."""
    hit = memo.get(id(x), _NIL)
    if hit is not _NIL:
        return hit
    fast = _FAST_COPY.get(type(x))
    return fast(x, memo) if fast is not None else copy.deepcopy(x, memo)


def _copy_dict(x: dict[Any, Any], memo: dict[int, Any]) -> dict[Any, Any]:
    """A dict copied as ``deepcopy`` copies it, its atomic keys and values taken as they are without a call each."""
    y: dict[Any, Any] = {}
    memo[id(x)] = y
    deep, atomic = _deep, _ATOMIC
    for k, v in x.items():
        y[k if type(k) in atomic else deep(k, memo)] = v if type(v) in atomic else deep(v, memo)
    return y


def _copy_list(x: list[Any], memo: dict[int, Any]) -> list[Any]:
    y: list[Any] = []
    memo[id(x)] = y
    deep, atomic = _deep, _ATOMIC
    y.extend(v if type(v) in atomic else deep(v, memo) for v in x)
    return y


def _copy_set(x: Any, memo: dict[int, Any]) -> Any:
    return set() if not x else {copy.deepcopy(v, memo) for v in x}  # as set's reduce does (a set holds no cycle)


# by exact type, as deepcopy looks up
_FAST_COPY: dict[type, Any] = {collections.OrderedDict: _copy_ordered_dict, set: _copy_set, dict: _copy_dict,
                              list: _copy_list}


def virtual_copy(obj: Any, tensors: list[tuple[torch.Tensor, torch.device, str]],
                 space: Space) -> tuple[Any, dict[int, Any]]:
    """A deep copy of ``obj`` in which each listed tensor is a virtual twin of a matching class (``Parameter``,
    ``Params4bit``): no weight bytes are copied and the copy shares nothing mutable with the user's objects."""
    memo: dict[int, Any] = {}
    made: list[tuple[torch.Tensor, Any]] = []
    foreign: list[tuple[torch.Tensor, str, str]] = []
    with torch._C.DisableTorchFunction():  # the user's tensors' metadata, read past the run's mode (~2 reads each)
        for t, device, path in tensors:
            if id(t) not in memo:
                why = unsupported_form(t)
                if why is not None:  # copied as it is (outside any mode); the run reports it where used or moved
                    memo[id(t)] = _copy_foreign(t, memo, path, why)
                    foreign.append((t, path, why))
                    continue
                memo[id(t)] = v = make(virtual_class(type(t)), space.inner_of(t), device, path, t.requires_grad)
                made.append((t, v))
    memo[id(memo)] = [t for t, _ in made]  # keep-alive, as copy.deepcopy does
    dispatch = copy._deepcopy_dispatch  # type: ignore[attr-defined]
    with _COPY_LOCK:
        if not _COPYING:
            _SAVED.clear()
            _SAVED.update({tp: dispatch.get(tp) for tp in (*_SHARED, types.FunctionType, *_FAST_COPY)})
            dispatch.update({tp: copy._deepcopy_atomic for tp in _SHARED})  # type: ignore[attr-defined]
            dispatch.update(_FAST_COPY)
            dispatch[types.FunctionType] = _copy_function
        _COPYING.add(threading.get_ident())
    try:
        clone = copy.deepcopy(obj, memo)
    except Exception as exc:
        raise TypeError(f"simulate works on a deep copy, and {type(obj).__name__} could not be copied: "
                        f"{type(exc).__name__}: {exc}") from exc
    finally:
        with _COPY_LOCK:
            _COPYING.discard(threading.get_ident())
            if not _COPYING:  # the last copy running restores the table
                for tp, old in _SAVED.items():
                    if old is None:
                        dispatch.pop(tp, None)
                    else:
                        dispatch[tp] = old
    for t, v in made:  # library attributes of tensors (bnb: quant_state, module, blocksize, CB, SCB)
        with torch._C.DisableTorchFunction():
            attrs = getattr(t, "__dict__", None)
        for k, val in (attrs or {}).items():
            v.__dict__[k] = copy.deepcopy(val, memo)
    for t, path, why in foreign:
        twin = memo.get(id(t))
        if isinstance(twin, torch.Tensor):
            space.foreign[id(twin)] = (path, why)
    return clone, memo


def _copy_foreign(t: torch.Tensor, memo: dict[int, Any], path: str, why: str) -> torch.Tensor:
    """A private copy of a tensor no twin stands in for, made outside every mode (strided nested tensors cannot be
    deep-copied at all: ``new_empty`` has no nested kernel, so they are cloned)."""
    from torchdoctor._walk.kinds import is_jagged_type

    with torch._C.DisableTorchFunction():
        d = getattr(t, "__dict__", {})
        if is_jagged_type(type(t)) and isinstance(d.get("_values"), torch.Tensor):
            # from its parts: torch's own clone/deepcopy of a jagged tensor rewrites the original's size caches
            lengths = d.get("_lengths")
            return torch.nested.nested_tensor_from_jagged(  # type: ignore[no-any-return]
                d["_values"].detach().clone(), d["_offsets"].clone(),
                lengths.clone() if isinstance(lengths, torch.Tensor) else None)
        try:
            return copy.deepcopy(t, memo)  # type: ignore[no-any-return]
        except Exception:
            pass
        try:
            c = t.detach().clone()
            return torch.nn.Parameter(c, t.requires_grad) if isinstance(t, torch.nn.Parameter) else c
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            raise TypeError(f"{path}: a {type(t).__name__} ({why}) could not be copied for the simulation: "
                            f"{type(exc).__name__}: {first}") from exc
