"""The walk over what the restricted unpickler built: tensors with dotted paths, and where each placeholder sits.

The object walker of :mod:`torchdoctor._walk` never sees these records (stubs, placeholders, plain containers);
this walk is iterative and bounded in nodes and depth, so a pickle nested on purpose cannot exhaust the stack.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torchdoctor._checkpoint.known import DTENSOR
from torchdoctor._checkpoint.unpickle import Placeholder, TensorStub

__all__ = ["WalkResult", "walk"]

# Keys of a pickled nn.Module's __dict__ that are containers, not names a user types.
_TRANSPARENT = frozenset({"_parameters", "_buffers", "_modules"})


class WalkResult:
    """Tensors with their paths, where each placeholder global sits (global -> (first path, call arguments)),
    and whether a bound cut the walk short."""

    __slots__ = ("tensors", "placeholders", "truncated")

    def __init__(self, tensors: list[tuple[str, TensorStub]], placeholders: dict[str, tuple[str, tuple[Any, ...]]],
                 truncated: bool) -> None:
        self.tensors = tensors
        self.placeholders = placeholders
        self.truncated = truncated


_SCALARS = (str, bytes, int, float, bool, type(None))


def _text(key: Any) -> str:
    if isinstance(key, Placeholder) or (isinstance(key, type) and issubclass(key, Placeholder)):
        return key._td_global.rsplit(".", 1)[-1]  # a class as a dict key: its name, as the user wrote it
    return key if isinstance(key, str) else str(key) if isinstance(key, int) else repr(key)


def _path(node: Any) -> str:
    """A path kept as (parent, key) links until a tensor or a global needs it: a child never copies its
    parent's key (one 8 MiB key over a million children is one string, not a million)."""
    parts = []
    while node:
        node, key = node
        parts.append(key)
    return ".".join(reversed(parts))


def walk(root: Any, max_nodes: int = 5_000_000, max_depth: int = 200) -> WalkResult:
    """Tensors reachable from an unpickled object, with dotted paths; also where each placeholder sits.

    >>> walk({"model": {"w": 1, "layers": [{"b": 2}]}}).tensors
    []
    """
    tensors: list[tuple[str, TensorStub]] = []
    holders: dict[str, tuple[str, tuple[Any, ...]]] = {}
    seen: set[int] = set()
    stack: list[tuple[Any, Any, int]] = [(root, (), 0)]
    nodes = 0
    truncated = False

    def hold(name: str, node: Any, args: tuple[Any, ...]) -> None:
        if name not in holders:
            holders[name] = (_path(node), args)

    while stack:
        obj, node, depth = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            truncated = True
            break
        if depth > max_depth:  # skip this branch only
            truncated = True
            continue
        if type(obj) is TensorStub:  # the same tensor under a second key is reported (as an alias)
            tensors.append((_path(node), obj))
            if not obj.attrs:  # the common tensor: nothing inside to walk
                continue
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        children: list[tuple[Any, Any]]
        if isinstance(obj, TensorStub):  # a DTensor's spec (mesh, placements) is metadata, not the model's tensors
            children = [((node, _text(k)), v) for k, v in obj.attrs.items() if k != "_spec" or obj.subclass != DTENSOR]
        elif isinstance(obj, dict):
            for k in obj:  # Lightning 1.x keys its callbacks by class: a global in key position sits here
                if isinstance(k, Placeholder) or (isinstance(k, type) and issubclass(k, Placeholder)):
                    hold(k._td_global, node, ())
            children = [((node, _text(k)), v) for k, v in obj.items() if type(v) not in _SCALARS]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            children = [((node, str(i)), v) for i, v in enumerate(obj) if type(v) not in _SCALARS]
        elif isinstance(obj, Placeholder):
            hold(obj._td_global, node, obj._td_args)
            state = obj.__dict__.get("_td_state")
            children = [((node, str(i)), v) for i, v in enumerate(obj._td_args)]
            if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):  # (dict, slots)
                state = {**state[0], **(state[1] or {})}
            if isinstance(state, dict):
                children += [(node if k in _TRANSPARENT else (node, _text(k)), v) for k, v in state.items()]
            elif state is not None:
                children.append((node, state))
            children += [((node, _text(k)), v) for k, v in obj._td_items.items()]
            children += [((node, _text(k)), v) for k, v in obj.__dict__.get("_td_attrs", {}).items()]
        elif isinstance(obj, type) and issubclass(obj, Placeholder):
            hold(obj._td_global, node, ())
            continue
        else:
            continue
        stack.extend(reversed([(v, p, depth + 1) for p, v in children]))
    return WalkResult(tensors, holders, truncated)
