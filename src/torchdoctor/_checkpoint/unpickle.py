"""Unpickle ``torch.save`` records without running a single line of their pickle code.

A restricted :class:`pickle.Unpickler` maps a short allow-list of torch / collections rebuild functions to
stand-ins that build :class:`TensorStub` records (dtype, shape, stride, the storage's *saved* location) and
never touch storage data. Any other global is never imported: it becomes a :class:`Placeholder` class that
records how the pickle tried to use it, so the tensors around it are still found and the global is named.

The container formats around the pickle live in :mod:`torchdoctor._checkpoint.torchfile`, which hands this
unpickler its storage records and its reader for storages embedded as small streams.
"""

from __future__ import annotations

import functools
import pickle
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import torch

from torchdoctor._checkpoint.known import DTENSOR, NJT_REBUILD, TORCH_RECORDS, torch_allows

__all__ = [
    "CheckpointError", "Placeholder", "SafeUnpickler", "StorageRef", "StorageType", "TensorStub", "placeholder_class",
]


class CheckpointError(ValueError):
    """A checkpoint that cannot be read: empty, truncated, corrupted or of an unsupported format (one line)."""


CheckpointError.__module__ = "torchdoctor"


@dataclass(frozen=True)
class StorageRef:
    """What a persistent id says about one storage: its key, the location it was *saved* on, dtype and size."""

    key: str
    location: str
    dtype: torch.dtype
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass
class TensorStub:
    """A tensor as the pickle describes it; no data behind it."""

    storage: StorageRef | None
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...] | None
    dtype: torch.dtype
    location: str
    parameter: bool = False
    subclass: str | None = None
    attrs: dict[str, Any] = field(default_factory=dict)

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


class _Safe:
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


class StorageType(_Safe):
    __slots__ = ("dtype",)
    dtype: torch.dtype

    def __init__(self, name: str, dtype: torch.dtype) -> None:
        super().__init__(name, _refuse(name))
        object.__setattr__(self, "dtype", dtype)


class _Marker(_Safe):
    """A torch class used as data (``new_type`` of ``_rebuild_from_type_v2``); calling it is refused."""

    __slots__ = ()


def _refuse(name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise pickle.UnpicklingError(f"{name} called directly")

    return call


def _stub(storage: Any, offset: Any, size: Any, stride: Any, dtype: torch.dtype | None = None) -> Any:
    if isinstance(storage, Placeholder):  # keep walking into it: it may hide the globals to report
        return placeholder_class("torch._utils._rebuild_tensor")(storage)
    if not isinstance(storage, StorageRef):
        raise pickle.UnpicklingError("tensor rebuilt from something that is not a storage")
    shape = tuple(int(s) for s in size)
    strides = tuple(int(s) for s in stride)
    return TensorStub(storage, int(offset), shape, strides, dtype or storage.dtype, storage.location)


def _rebuild_v2(storage: Any, offset: Any, size: Any, stride: Any, *rest: Any) -> TensorStub:
    return _stub(storage, offset, size, stride)


def _rebuild_v3(storage: Any, offset: Any, size: Any, stride: Any, rg: Any, hooks: Any, dtype: Any, *rest: Any) -> Any:
    return _stub(storage, offset, size, stride, dtype if isinstance(dtype, torch.dtype) else None)


def _rebuild_parameter(data: Any, *rest: Any) -> Any:
    if isinstance(data, TensorStub):
        data.parameter = True
        if len(rest) >= 3 and isinstance(rest[2], dict):  # _rebuild_parameter_with_state
            data.attrs.update({str(k): v for k, v in rest[2].items()})
    return data


def _rebuild_from_type(func: Any, new_type: Any, args: Any, state: Any = None) -> Any:
    is_record = isinstance(func, type) and issubclass(func, Placeholder)  # e.g. torch's _rebuild_njt: recorded
    if not (isinstance(func, _Safe) or is_record) or not isinstance(args, tuple):
        raise pickle.UnpicklingError("_rebuild_from_type_v2 with an unexpected rebuild function")
    if is_record and func._td_global == NJT_REBUILD and args and isinstance(args[0], dict):
        values = args[0].get("values")  # a nested jagged tensor is one tensor: its packed values, internals hidden
        if isinstance(values, TensorStub):
            values.subclass = "torch.nested._internal.nested_tensor.NestedTensor"
            return values
    obj = func(*args)
    if isinstance(obj, TensorStub):
        if isinstance(new_type, type) and issubclass(new_type, Placeholder):
            obj.subclass = new_type._td_global
        if isinstance(state, tuple) and len(state) == 2 and all(p is None or isinstance(p, dict) for p in state):
            state = {**(state[0] or {}), **(state[1] or {})}  # (dict, slots): DTensor keeps its fields in slots
        if isinstance(state, dict):
            obj.attrs.update({str(k): v for k, v in state.items()})
        local = obj.attrs.get("_local_tensor")
        if obj.subclass == DTENSOR and isinstance(local, TensorStub):  # a rank's shard: its bytes are the local
            del obj.attrs["_local_tensor"]  # tensor's; shape and dtype stay the global tensor's
            obj.storage, obj.offset, obj.stride, obj.location = local.storage, local.offset, local.stride, local.location
            obj.attrs["__local_shape__"] = local.shape
    return obj



def _rebuild_no_storage(dtype: Any, size: Any, stride: Any, *rest: Any) -> TensorStub:
    if not isinstance(dtype, torch.dtype):
        raise pickle.UnpicklingError("meta tensor without a dtype")
    return TensorStub(None, 0, tuple(int(s) for s in size), tuple(int(s) for s in stride), dtype, "meta")


def _rebuild_wrapper_subclass(
    cls: Any, dtype: Any, size: Any, stride: Any, offset: Any, layout: Any, device: Any, *rest: Any
) -> TensorStub:
    stub = _rebuild_no_storage(dtype, size, stride)
    stub.location = str(device)
    if isinstance(cls, type) and issubclass(cls, Placeholder):
        stub.subclass = cls._td_global
    return stub


def _rebuild_on_device(data: Any, dtype: Any, device: Any, *rest: Any) -> Any:
    if isinstance(data, TensorStub):  # data was saved on cpu, rebuilt on ``device`` at load time
        data.location = str(device)
    return data


def _packed(name: str, layout: str, data: Any, *rest: Any) -> Any:
    """A sparse or strided-nested tensor is one tensor: its values buffer (the last tensor of its parts) with
    the dense size when the record has one; indices and offsets are internals, not listed."""
    parts = data if isinstance(data, tuple) else (data, *rest)
    stubs = [p for p in parts if isinstance(p, TensorStub)]
    if not stubs:  # keep walking into it: it may hide the globals to report
        return placeholder_class(name)(data, *rest)
    values = stubs[-1] if layout != "nested" else stubs[0]
    size = next((p for p in parts if isinstance(p, torch.Size)), None)
    return TensorStub(values.storage, values.offset, tuple(size) if size is not None else values.shape,
                      values.stride, values.dtype, values.location, subclass=f"{layout} tensor")


def _device(*args: Any) -> torch.device:
    if not all(isinstance(a, (str, int)) for a in args) or not 1 <= len(args) <= 2:
        raise pickle.UnpicklingError("torch.device with unexpected arguments")
    return torch.device(*args)


def _size(dims: Any = ()) -> torch.Size:
    if not isinstance(dims, (tuple, list)) or not all(isinstance(d, int) for d in dims):
        raise pickle.UnpicklingError("torch.Size with unexpected arguments")
    return torch.Size(dims)


def _encode(text: Any, encoding: Any = "latin1") -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("_codecs.encode with unexpected arguments")
    return text.encode("latin1")


def _bytes_like(kind: type) -> Callable[..., Any]:
    def make(data: Any = b"", *rest: Any) -> Any:
        if isinstance(data, int):  # bytes(10**12) would be a memory bomb
            raise pickle.UnpicklingError(f"{kind.__name__} from an int")
        if isinstance(data, str):
            return kind(data.encode("latin1"))
        return kind(data)

    return make


def _complex(hashes: Any, re: Any = 0.0, im: Any = 0.0) -> complex:
    value = complex(float(re), float(im))
    if hashes is not None and not hashes.add(value):  # complex(k * 1000003, -k) all share one hash
        raise pickle.UnpicklingError("too many complex numbers sharing one hash value")
    return value


def _collection(kind: Callable[..., Any]) -> Callable[..., Any]:
    def make(items: Any = (), *rest: Any) -> Any:
        if not isinstance(items, (list, tuple, set, frozenset, dict)):
            raise pickle.UnpicklingError("collection built from something that is not a collection")
        return kind(items)

    return make


def _safe_table() -> dict[str, Any]:
    u = "torch._utils."
    table: dict[str, Any] = {
        u + "_rebuild_tensor": _rebuild_v2,
        u + "_rebuild_tensor_v2": _rebuild_v2,
        u + "_rebuild_tensor_v3": _rebuild_v3,
        u + "_rebuild_parameter": _rebuild_parameter,
        u + "_rebuild_parameter_with_state": _rebuild_parameter,
        u + "_rebuild_qtensor": _rebuild_v2,
        u + "_rebuild_meta_tensor_no_storage": _rebuild_no_storage,
        u + "_rebuild_wrapper_subclass": _rebuild_wrapper_subclass,
        u + "_rebuild_device_tensor_from_cpu_tensor": _rebuild_on_device,
        u + "_rebuild_sparse_tensor": lambda layout, data, *r: _packed(u + "_rebuild_sparse_tensor", str(layout), data),
        u + "_rebuild_nested_tensor": lambda *parts: _packed(u + "_rebuild_nested_tensor", "nested", parts),
        "torch._tensor._rebuild_from_type_v2": _rebuild_from_type,
        "torch._tensor._rebuild_from_type": _rebuild_from_type,
        "torch.serialization._get_layout": lambda name: str(name),
        "torch.device": _device,
        "torch.Size": _size,
        "collections.OrderedDict": _collection(OrderedDict),
        "collections.defaultdict": lambda *a: {},
        "collections.Counter": _collection(dict),
        "builtins.set": _collection(set),
        "builtins.frozenset": _collection(frozenset),
        "builtins.list": _collection(list),
        "builtins.tuple": _collection(tuple),
        "builtins.dict": _collection(dict),
        "builtins.slice": slice,
        "builtins.bytes": _bytes_like(bytes),
        "builtins.bytearray": _bytes_like(bytearray),
        "_codecs.encode": _encode,
    }
    safe: dict[str, Any] = {name: _Safe(name, fn) for name, fn in table.items()}
    for name in ("torch.Tensor", "torch._tensor.Tensor", "torch.nn.parameter.Parameter", "torch.nn.parameter.Buffer"):
        safe[name] = _Marker(name, _refuse(name))
    for dtype, storage_name in torch.storage._dtype_to_storage_type_map().items():
        for module in ("torch", "torch.cuda"):
            safe[f"{module}.{storage_name}"] = StorageType(f"{module}.{storage_name}", dtype)
    for name in ("torch.UntypedStorage", "torch.storage.UntypedStorage", "torch.storage.TypedStorage"):
        safe[name] = StorageType(name, torch.uint8)
    for attr, value in vars(torch).items():  # dtypes, memory formats and qschemes are plain values
        if not attr.startswith("_") and isinstance(value, (torch.dtype, torch.memory_format, torch.qscheme, torch.layout)):
            safe[f"torch.{attr}"] = value
    return safe


_SAFE: dict[str, Any] = {}
_MODULE_ALIASES = {"__builtin__": "builtins", "copy_reg": "copyreg", "torch.tensor": "torch._tensor"}


class SafeUnpickler(pickle.Unpickler):
    """Resolves only allow-listed globals; everything else becomes a placeholder and is recorded.

    ``nested(unknown, data)`` reads a storage that the pickle embeds as a small ``torch.save`` stream
    (``torch.storage._load_from_bytes``); the container readers of :mod:`torchdoctor._checkpoint.torchfile` supply it,
    so this module does not depend on them. Without it that global is a placeholder like any other.
    """

    def __init__(
        self,
        file: IO[bytes],
        persistent: Callable[[Any], Any] | None = None,
        nested: Callable[[dict[str, type[Placeholder]], Any], Any] | None = None,
        hashes: Any = None,
    ) -> None:
        super().__init__(file, encoding="latin1")
        if not _SAFE:
            _SAFE.update(_safe_table())
        self.unknown: dict[str, type[Placeholder]] = {}
        self._persistent = persistent
        self._nested = nested
        self._complex = _Safe("builtins.complex", functools.partial(_complex, hashes))

    def find_class(self, module: str, name: str) -> Any:
        module = _MODULE_ALIASES.get(module, module)
        full = f"{module}.{name}"
        safe = _SAFE.get(full)
        if safe is not None:
            return safe
        if full == "builtins.complex":
            return self._complex
        if full == "torch.storage._load_from_bytes" and self._nested is not None:
            return _Safe(full, functools.partial(self._nested, self.unknown))
        if full in TORCH_RECORDS or torch_allows(full):  # read as a record, not reported: torch loads it
            return placeholder_class(full)
        if full not in self.unknown:
            self.unknown[full] = placeholder_class(full)
        return self.unknown[full]

    def persistent_load(self, pid: Any) -> Any:
        if self._persistent is None:
            raise pickle.UnpicklingError("persistent id in a plain pickle")
        return self._persistent(pid)
