"""An op's arguments: how they are addressed (keys ``(position or kwarg name, index in a list or -1)``) and the
fast checks that run on every aten op before any rule looks (one device, one dtype)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchdoctor._placement import FLOAT8_DTYPES, tensor_device

_Tensor = torch.Tensor

Key = tuple[Any, int]  # (position or kwarg name, index in a list argument or -1)


class OpArgs:
    """An op's arguments, addressed by the rules' keys ``(position or kwarg name, index in a list or -1)``: the one
    way the rules, guard's fixer and the simulator read and replace an argument."""

    args: Sequence[Any]
    kwargs: Mapping[str, Any]

    def __init__(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        self.args, self.kwargs = args, kwargs

    def at(self, key: Key) -> Any:
        pos, j = key
        v: Any = self.kwargs.get(pos) if isinstance(pos, str) else self.args[pos]
        return v[j] if j >= 0 else v

    def put(self, key: Key, value: Any) -> None:
        """Replace one argument in place (``args`` a list, ``kwargs`` a dict); a list item keeps its sequence type."""
        pos, j = key
        holder: Any = self.kwargs if isinstance(pos, str) else self.args
        if j >= 0:
            seq = holder[pos]
            value = type(seq)(value if i == j else x for i, x in enumerate(seq))
        holder[pos] = value

    def all_tensors(self) -> list[Any]:
        """Every tensor argument, those in a list or tuple argument included, in argument order."""
        out: list[Any] = []
        for a in (*self.args, *self.kwargs.values()):
            if isinstance(a, torch.Tensor):
                out.append(a)
            elif type(a) is list or type(a) is tuple:
                out.extend(x for x in a if isinstance(x, torch.Tensor))
        return out


class _Call(OpArgs):
    """One op call, tensors gathered once (slow path only). A plain class: a dataclass compiles its methods when the
    module is imported, which a virtual run pays before the program's first line (issue 43 point 4)."""

    def __init__(self, op: Any, args: Sequence[Any], kwargs: Mapping[str, Any], tensors: list[tuple[Key, torch.Tensor]],
                 names: tuple[str, ...]) -> None:
        self.op, self.args, self.kwargs, self.tensors, self.names = op, args, kwargs, tensors, names

    def __repr__(self) -> str:
        return f"_Call(op={self.op!r}, args={self.args!r}, kwargs={self.kwargs!r}, names={self.names!r})"

    def name_of(self, key: Key) -> str:
        pos = key[0]
        if isinstance(pos, str):
            return pos
        return self.names[pos] if pos < len(self.names) else f"arg{pos}"

    def label(self, key: Key) -> str:
        pos, j = key
        item = f"[{j}]" if j >= 0 else ""
        if isinstance(pos, str):
            return f"kwarg {pos}{item}"
        return f"arg {pos} ({self.name_of(key)}{item})"

    def get(self, pos: Any) -> Any:
        if isinstance(pos, str):
            return self.kwargs.get(pos)
        if pos < len(self.args):
            return self.args[pos]
        name = self.names[pos] if pos < len(self.names) else None
        return self.kwargs.get(name) if name else None

    def tensor(self, pos: Any) -> torch.Tensor | None:
        v = self.get(pos)
        return v if isinstance(v, _Tensor) else None

    def key_of(self, pos: int) -> Key:
        return (pos, -1) if pos < len(self.args) else (self.names[pos], -1)


_NAMES: dict[Any, tuple[str, ...]] = {}


def _arg_names(op: Any) -> tuple[str, ...]:
    names = _NAMES.get(op)
    if names is None:
        schema = getattr(op, "_schema", None)
        names = _NAMES[op] = tuple(a.name for a in schema.arguments) if schema is not None else ()
    return names


_FLOAT8 = FLOAT8_DTYPES


def _gather(args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[tuple[Key, torch.Tensor]]:
    out: list[tuple[Key, torch.Tensor]] = []
    for i, a in enumerate(args):
        if isinstance(a, _Tensor):
            out.append(((i, -1), a))
        elif type(a) is list or type(a) is tuple:
            out.extend(((i, j), b) for j, b in enumerate(a) if isinstance(b, _Tensor))
    for k, a in kwargs.items():
        if isinstance(a, _Tensor):
            out.append(((k, -1), a))
        elif type(a) is list or type(a) is tuple:
            out.extend(((k, j), b) for j, b in enumerate(a) if isinstance(b, _Tensor))
    return out


def _inert(kwargs: Mapping[str, Any]) -> bool:
    """Keyword arguments no rule looks at: no tensors, no ``device``/``dtype`` (``alpha=1``, ``dim=-1``)."""
    if "device" in kwargs or "dtype" in kwargs:
        return False
    for v in kwargs.values():
        if isinstance(v, _Tensor) or ((type(v) is list or type(v) is tuple) and any(isinstance(x, _Tensor) for x in v)):
            return False
    return True


_CASTS = frozenset({"aten::_to_copy", "aten::copy_", "aten::to", "aten::_copy_from", "aten::_copy_from_and_resize",
                    "aten::clone", "aten::view", "aten::_scaled_mm", "aten::detach", "aten::alias"})


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _plain_agree(args: Sequence[Any], any_dtype: bool) -> bool:
    """Top-level plain tensors share one device (and one dtype unless ``any_dtype``); anything else: False (the
    general path decides)."""
    dev = dt = None
    for a in args:
        tp = type(a)
        if (tp is _PLAIN[0] or tp is _PLAIN[1]) and "_td_device" not in a.__dict__:
            if dev is None:
                dev, dt = a.device, a.dtype
            elif a.device != dev or (a.dtype is not dt and (not any_dtype or a.dtype in _FLOAT8 or dt in _FLOAT8)):
                return False
        elif tp is list or tp is tuple:
            for x in a:  # a shape or a dim list is fine; tensors in a list go the general way
                if isinstance(x, _Tensor):
                    return False
        elif isinstance(a, _Tensor):
            return False
    return True


def _uniform(seq: Any, state: list[Any]) -> bool:
    """One level over ``seq``; ``state`` is [device, dtype, dtypes differ] of the tensors so far. False as soon as
    two devices differ; differing dtypes only set ``state[2]`` (most ops have no dtype rule: ``where`` with a
    bool mask, ``embedding`` with int64 indices)."""
    for a in seq:
        if isinstance(a, _Tensor):
            if state[1] is None:
                state[0], state[1] = tensor_device(a), a.dtype
            else:
                if tensor_device(a) != state[0]:
                    return False
                if a.dtype is not state[1]:
                    state[2] = True
        elif type(a) is list or type(a) is tuple:
            if not _uniform(a, state):
                return False
    return True


# schema types that never hold a tensor when a dispatch mode sees the call (ScalarType, Layout and MemoryFormat
# print as int; a Scalar arrives as a Python number)
_NO_TENSOR = frozenset({"int", "float", "bool", "str", "complex", "number", "Device", "Generator", "Storage",
                        "AnyEnumType", "SymInt", "SymFloat", "SymBool", "Layout", "ScalarType", "MemoryFormat"})


def tensor_kind(schema_type: Any) -> int:
    """What an argument of this schema type may hold: 0 no tensor, 1 one tensor, 2 a list of tensors, -1 unknown
    (``Dict``, ``List[t]``, script classes: no fast path for the op)."""
    s = str(schema_type)
    if s.startswith("Optional["):
        s = s[9:-1]
    if s in _NO_TENSOR:
        return 0
    if s == "Tensor":
        return 1
    if s.startswith("List["):
        s = s[5:-1]
        if s.startswith("Optional["):
            s = s[9:-1]
        return 0 if s in _NO_TENSOR else 2 if s == "Tensor" else -1
    return -1


def dispatch_slots(op: Any) -> tuple[tuple[int, ...], tuple[int, ...], bool, bool] | None:
    """Where the tensors of ``op`` can be as a dispatch mode receives it (positional arguments in ``args``, the
    keyword-only ones in ``kwargs``): (positions of single tensors, positions of tensor lists, every positional
    argument may be a tensor, a keyword-only argument may be a tensor or name a ``device``/``dtype``). None:
    the schema is unknown. One possible tensor and no list: positions are () (nothing to compare)."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return None
    pos: list[int] = []
    lists: list[int] = []
    n_pos = 0
    kw = False
    for i, a in enumerate(schema.arguments):
        kind = tensor_kind(a.type)
        if kind < 0:
            return None
        if a.kwarg_only:
            kw = kw or kind > 0 or a.name in ("device", "dtype")
            continue
        n_pos += 1
        if kind == 1:
            pos.append(i)
        elif kind == 2:
            lists.append(i)
    if not lists and len(pos) <= 1:
        return (), (), False, kw
    return tuple(pos), tuple(lists), not lists and len(pos) == n_pos, kw


# a plain tensor carries a simulation's device label (``_td_device`` in its ``__dict__``) only in a process where
# the virtual runtime, which puts it there, is loaded
LABELLER = "torchdoctor._virtual"
