"""The walk over what the restricted unpickler built: tensors with dotted paths, and where each placeholder sits.

The object walker of :mod:`torchdoctor._walk` never sees these records (stubs, placeholders, plain containers);
this walk is iterative and bounded in nodes and depth, so a pickle nested on purpose cannot exhaust the stack.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torchdoctor._checkpoint.known import DTENSOR
from torchdoctor._checkpoint.unpickle import Placeholder, TensorStub

__all__ = ["WalkResult", "walk"]

# Keys of a pickled nn.Module's __dict__ that are containers, not names a user types.
_TRANSPARENT = frozenset({"_parameters", "_buffers", "_modules"})


@dataclass
class WalkResult:
    tensors: list[tuple[str, TensorStub]]
    placeholders: dict[str, tuple[str, tuple[Any, ...]]]  # global -> (first path, call arguments)
    truncated: bool


def walk(root: Any, max_nodes: int = 5_000_000, max_depth: int = 200) -> WalkResult:
    """Tensors reachable from an unpickled object, with dotted paths; also where each placeholder sits.

    >>> walk({"model": {"w": 1, "layers": [{"b": 2}]}}).tensors
    []
    """
    tensors: list[tuple[str, TensorStub]] = []
    holders: dict[str, tuple[str, tuple[Any, ...]]] = {}
    seen: set[int] = set()
    stack: list[tuple[Any, str, int]] = [(root, "", 0)]
    nodes = 0
    truncated = False

    def join(path: str, key: Any) -> str:
        if isinstance(key, Placeholder) or (isinstance(key, type) and issubclass(key, Placeholder)):
            key = key._td_global.rsplit(".", 1)[-1]  # a class as a dict key: its name, as the user wrote it
        k = key if isinstance(key, str) else repr(key) if not isinstance(key, int) else str(key)
        return f"{path}.{k}" if path else k

    while stack:
        obj, path, depth = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            truncated = True
            break
        if depth > max_depth:  # skip this branch only
            truncated = True
            continue
        if type(obj) in (str, bytes, int, float, bool, type(None)):
            continue
        if isinstance(obj, TensorStub):  # the same tensor under a second key is reported (as an alias)
            tensors.append((path, obj))
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        children: Iterator[tuple[str, Any]]
        if isinstance(obj, TensorStub):  # a DTensor's spec (mesh, placements) is metadata, not the model's tensors
            children = ((join(path, k), v) for k, v in obj.attrs.items() if k != "_spec" or obj.subclass != DTENSOR)
        elif isinstance(obj, dict):
            for k in obj:  # Lightning 1.x keys its callbacks by class: a global in key position sits here
                if isinstance(k, Placeholder) or (isinstance(k, type) and issubclass(k, Placeholder)):
                    holders.setdefault(k._td_global, (path, ()))
            children = ((join(path, k), v) for k, v in obj.items())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            children = ((join(path, i), v) for i, v in enumerate(obj))
        elif isinstance(obj, Placeholder):
            holders.setdefault(obj._td_global, (path, obj._td_args))
            state = obj.__dict__.get("_td_state")
            parts: list[tuple[str, Any]] = [(join(path, i), v) for i, v in enumerate(obj._td_args)]
            if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):  # (dict, slots)
                state = {**state[0], **(state[1] or {})}
            if isinstance(state, dict):
                parts += [(path if k in _TRANSPARENT else join(path, k), v) for k, v in state.items()]
            elif state is not None:
                parts.append((path, state))
            parts += [(join(path, k), v) for k, v in obj._td_items.items()]
            parts += [(join(path, k), v) for k, v in obj.__dict__.get("_td_attrs", {}).items()]
            children = iter(parts)
        elif isinstance(obj, type) and issubclass(obj, Placeholder):
            holders.setdefault(obj._td_global, (path, ()))
            continue
        else:
            continue
        stack.extend(reversed([(v, p, depth + 1) for p, v in children]))
    return WalkResult(tensors, holders, truncated)
