"""The records the restricted unpickler builds: tensors without data, storages by key, placeholders for globals
that were never imported, and the allow-listed stand-ins (torch-free: dtypes are :class:`DType` names).
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable
from typing import Any

from torchdoctor._checkpoint.dtypes import DType
from torchdoctor._checkpoint.errors import CheckpointError, UnsafePickle

__all__ = [
    "CheckpointError", "Marker", "Placeholder", "Safe", "StorageRef", "StorageType", "TensorStub", "UnsafePickle",
    "placeholder_class", "refuse",
]  # fmt: skip


class StorageRef:
    """What a persistent id says about one storage: its key, the location it was *saved* on, dtype and size.

    Immutable, compared and hashed by its fields. A plain slotted class, not a dataclass: the checkpoint command
    line never imports ``dataclasses`` (it imports ``inspect`` and compiles methods at import; docs/checkpoints.md,
    "Cost")."""

    __slots__ = ("key", "location", "dtype", "numel")
    key: str
    location: str
    dtype: DType
    numel: int

    def __init__(self, key: str, location: str, dtype: DType, numel: int) -> None:
        setattr_ = object.__setattr__
        setattr_(self, "key", key)
        setattr_(self, "location", location)
        setattr_(self, "dtype", dtype)
        setattr_(self, "numel", numel)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"StorageRef is immutable (set {name!r})")

    def _fields(self) -> tuple[Any, ...]:
        return (self.key, self.location, self.dtype, self.numel)

    def __eq__(self, other: object) -> bool:
        return type(other) is StorageRef and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return f"StorageRef(key={self.key!r}, location={self.location!r}, dtype={self.dtype!r}, numel={self.numel!r})"

    def with_key(self, key: str) -> StorageRef:
        return StorageRef(key, self.location, self.dtype, self.numel)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


class TensorStub:
    """A tensor as the pickle describes it; no data behind it. (Slotted, built once per tensor.)"""

    __slots__ = ("storage", "offset", "shape", "stride", "dtype", "location", "parameter", "subclass", "attrs")
    storage: StorageRef | None
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...] | None
    dtype: DType
    location: str
    parameter: bool
    subclass: str | None
    attrs: dict[str, Any]

    def __init__(self, storage: StorageRef | None, offset: int, shape: tuple[int, ...],
                 stride: tuple[int, ...] | None, dtype: DType, location: str, parameter: bool = False,
                 subclass: str | None = None, attrs: dict[str, Any] | None = None) -> None:
        self.storage = storage
        self.offset = offset
        self.shape = shape
        self.stride = stride
        self.dtype = dtype
        self.location = location
        self.parameter = parameter
        self.subclass = subclass
        self.attrs = {} if attrs is None else attrs

    def __repr__(self) -> str:
        return (f"TensorStub(storage={self.storage!r}, offset={self.offset!r}, shape={self.shape!r}, "
                f"stride={self.stride!r}, dtype={self.dtype!r}, location={self.location!r}, "
                f"parameter={self.parameter!r}, subclass={self.subclass!r}, attrs={self.attrs!r})")

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * self.dtype.itemsize

    def __setstate__(self, state: Any) -> None:  # BUILD on a rebuilt tensor: keep the state to walk it
        self.attrs["__state__"] = state


class _PlaceholderType(type):
    def __repr__(cls) -> str:
        return f"<not imported: {getattr(cls, '_td_global', '?')}>"


class Placeholder(metaclass=_PlaceholderType):
    """An object built from a global that was not imported. Records its arguments, state and items."""

    _td_global = "?"
    _td_args: tuple[Any, ...]
    _td_items: dict[Any, Any]

    def __new__(cls, *args: Any, **kwargs: Any) -> Placeholder:
        obj = object.__new__(cls)
        obj.__dict__["_td_args"] = args + ((kwargs,) if kwargs else ())
        obj.__dict__["_td_items"] = {}
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Placeholder:
        name = self._td_global if self._td_global.endswith("()") else f"{self._td_global}()"  # x()() is x()
        return placeholder_class(name)(*args, **kwargs)

    def __setstate__(self, state: Any) -> None:
        self.__dict__["_td_state"] = state

    def __setattr__(self, key: str, value: Any) -> None:
        self.__dict__.setdefault("_td_attrs", {})[key] = value

    def __setitem__(self, key: Any, value: Any) -> None:
        self._td_items[key] = value

    def append(self, value: Any) -> None:
        self._td_items[len(self._td_items)] = value

    def extend(self, values: Any) -> None:
        for v in list(values):
            self.append(v)

    def add(self, value: Any) -> None:
        self.append(value)

    def __repr__(self) -> str:
        return f"<not imported: {self._td_global}>"


@functools.lru_cache(maxsize=4096)  # a placeholder called a million times through the memo makes one class
def placeholder_class(name: str) -> type[Placeholder]:
    return type(name.rsplit(".", 1)[-1], (Placeholder,), {"_td_global": name, "__module__": "torchdoctor._checkpoint.unpickle"})


class Safe:
    """An allow-listed global. Refuses BUILD and attribute writes, so a pickle cannot reconfigure it."""

    __slots__ = ("name", "fn")
    name: str
    fn: Callable[..., Any]

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "fn", fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __setattr__(self, key: str, value: Any) -> None:
        raise pickle.UnpicklingError(f"pickle tried to set {key!r} on {self.name}")

    def __setstate__(self, state: Any) -> None:
        raise pickle.UnpicklingError(f"pickle tried to BUILD on {self.name}")


class StorageType(Safe):
    __slots__ = ("dtype",)
    dtype: DType

    def __init__(self, name: str, dtype: DType) -> None:
        super().__init__(name, refuse(name))
        object.__setattr__(self, "dtype", dtype)


class Marker(Safe):
    """A torch class used as data (``new_type`` of ``_rebuild_from_type_v2``); calling it is refused."""

    __slots__ = ()


def refuse(name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise pickle.UnpicklingError(f"{name} called directly")

    return call
