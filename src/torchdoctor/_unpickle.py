"""Read ``torch.save`` files without running a single line of their pickle code.

A restricted :class:`pickle.Unpickler` maps a short allow-list of torch / collections rebuild functions to
stand-ins that build :class:`TensorStub` records (dtype, shape, stride, the storage's *saved* location) and
never touch storage data. Any other global is never imported: it becomes a :class:`Placeholder` class that
records how the pickle tried to use it, so the tensors around it are still found and the global is named.

Both container formats are read here: the zip format (``archive/data.pkl`` plus one entry per storage, sizes
taken from the zip directory) and the legacy stream (magic number, protocol, sys info, the main pickle, the
storage keys, then raw storage data that is skipped by arithmetic, never read). Plain pickles
(``pickle.dump(state_dict)``) work too: each storage inside is a small embedded legacy stream, read the same way.
The walker here follows unpickled records (stubs, placeholders, containers), which the object walker of
:mod:`torchdoctor._walk` never sees.
"""

from __future__ import annotations

import functools
import io
import itertools
import os
import pickle
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import IO, Any

import torch

__all__ = ["CheckpointError", "PickleFile", "Placeholder", "TensorStub", "read_torch_file", "safe_loads", "walk"]

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001
_MAX_PICKLE_BYTES = 1 << 30  # a data.pkl larger than this is not a state dict anyone can inspect usefully
SMALL_READ = 4096  # the only tensor bytes ever read: bitsandbytes' packed JSON quant_state


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
        return _placeholder_class(f"{self._td_global}()")(*args, **kwargs)

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


def _placeholder_class(name: str) -> type[Placeholder]:
    return type(name.rsplit(".", 1)[-1], (Placeholder,), {"_td_global": name, "__module__": "torchdoctor._unpickle"})


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


class _StorageType(_Safe):
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
        return _placeholder_class("torch._utils._rebuild_tensor")(storage)
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
    if not callable(func) or not isinstance(func, _Safe) or not isinstance(args, tuple):
        raise pickle.UnpicklingError("_rebuild_from_type_v2 with an unexpected rebuild function")
    obj = func(*args)
    if isinstance(obj, TensorStub):
        if isinstance(new_type, type) and issubclass(new_type, Placeholder):
            obj.subclass = new_type._td_global
        if isinstance(state, dict):
            obj.attrs.update({str(k): v for k, v in state.items()})
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


def _rebuild_qtensor(storage: Any, offset: Any, size: Any, stride: Any, *rest: Any) -> TensorStub:
    return _stub(storage, offset, size, stride)


_PICKLED_STORAGES = itertools.count()


def _load_from_bytes(unknown: dict[str, type[Placeholder]], data: Any) -> Any:
    """``pickle.dumps(tensor)`` embeds each storage as a small ``torch.save`` stream: read it the same way.
    Globals the embedded pickle names are recorded in the outer unpickler's ``unknown``."""
    if not isinstance(data, (bytes, bytearray)):
        raise pickle.UnpicklingError("_load_from_bytes without bytes")
    raw = bytes(data)
    try:
        reader = _read_zip if raw.startswith(b"PK") else _read_legacy
        inner = reader(io.BytesIO(raw), len(raw), "embedded storage", lambda: io.BytesIO(raw))
    except CheckpointError as exc:
        raise pickle.UnpicklingError(str(exc)) from None
    for name in inner.unknown_globals:
        unknown.setdefault(name, _placeholder_class(name))
    if isinstance(inner.root, StorageRef):
        return replace(inner.root, key=f"pickled-{next(_PICKLED_STORAGES)}")  # each blob is its own storage
    return inner.root


def _opaque(name: str) -> Callable[..., Any]:
    """A known torch rebuild function we do not model: keep its arguments so tensors inside are still found."""
    cls = _placeholder_class(name)
    return lambda *args, **kwargs: cls(*args, **kwargs)


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
        u + "_rebuild_qtensor": _rebuild_qtensor,
        u + "_rebuild_meta_tensor_no_storage": _rebuild_no_storage,
        u + "_rebuild_wrapper_subclass": _rebuild_wrapper_subclass,
        u + "_rebuild_device_tensor_from_cpu_tensor": _rebuild_on_device,
        u + "_rebuild_sparse_tensor": _opaque(u + "_rebuild_sparse_tensor"),
        u + "_rebuild_nested_tensor": _opaque(u + "_rebuild_nested_tensor"),
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
        "builtins.complex": lambda re=0.0, im=0.0: complex(float(re), float(im)),
        "builtins.bytes": _bytes_like(bytes),
        "builtins.bytearray": _bytes_like(bytearray),
        "_codecs.encode": _encode,
    }
    safe: dict[str, Any] = {name: _Safe(name, fn) for name, fn in table.items()}
    for name in ("torch.Tensor", "torch._tensor.Tensor", "torch.nn.parameter.Parameter", "torch.nn.parameter.Buffer"):
        safe[name] = _Marker(name, _refuse(name))
    for dtype, storage_name in torch.storage._dtype_to_storage_type_map().items():
        for module in ("torch", "torch.cuda"):
            safe[f"{module}.{storage_name}"] = _StorageType(f"{module}.{storage_name}", dtype)
    for name in ("torch.UntypedStorage", "torch.storage.UntypedStorage", "torch.storage.TypedStorage"):
        safe[name] = _StorageType(name, torch.uint8)
    for attr, value in vars(torch).items():  # dtypes, memory formats and qschemes are plain values
        if not attr.startswith("_") and isinstance(value, (torch.dtype, torch.memory_format, torch.qscheme)):
            safe[f"torch.{attr}"] = value
    return safe


_SAFE: dict[str, Any] = {}
_MODULE_ALIASES = {"__builtin__": "builtins", "copy_reg": "copyreg", "torch.tensor": "torch._tensor"}


class SafeUnpickler(pickle.Unpickler):
    """Resolves only allow-listed globals; everything else becomes a placeholder and is recorded."""

    def __init__(self, file: IO[bytes], persistent: Callable[[Any], Any] | None = None) -> None:
        super().__init__(file, encoding="latin1")
        if not _SAFE:
            _SAFE.update(_safe_table())
        self.unknown: dict[str, type[Placeholder]] = {}
        self._persistent = persistent

    def find_class(self, module: str, name: str) -> Any:
        module = _MODULE_ALIASES.get(module, module)
        full = f"{module}.{name}"
        safe = _SAFE.get(full)
        if safe is not None:
            return safe
        if full == "torch.storage._load_from_bytes":
            return _Safe(full, functools.partial(_load_from_bytes, self.unknown))
        if full not in self.unknown:
            self.unknown[full] = _placeholder_class(full)
        return self.unknown[full]

    def persistent_load(self, pid: Any) -> Any:
        if self._persistent is None:
            raise pickle.UnpicklingError("persistent id in a plain pickle")
        return self._persistent(pid)


def safe_loads(data: bytes) -> Any:
    """Unpickle ``data`` with no code execution: unknown globals come back as placeholders.

    >>> import pickle, os
    >>> obj = safe_loads(pickle.dumps({"x": [1, 2]}))
    >>> obj
    {'x': [1, 2]}
    >>> class Evil:
    ...     def __reduce__(self):
    ...         return (os.system, ("echo never runs",))
    >>> safe_loads(pickle.dumps(Evil()))._td_args
    ('echo never runs',)
    """
    return SafeUnpickler(io.BytesIO(data)).load()


@dataclass
class PickleFile:
    """One ``torch.save`` file as read without its data."""

    format: str  # "torch-zip", "torch-legacy", "torchscript", "pickle"
    root: Any
    storages: dict[str, StorageRef]
    unknown_globals: tuple[str, ...]
    notes: list[str] = field(default_factory=list)
    _small: Callable[[StorageRef], bytes | None] = lambda ref: None

    def read_small(self, ref: StorageRef) -> bytes | None:
        """Bytes of a tiny storage (at most ``SMALL_READ``), or None; nothing larger is ever read."""
        if ref.nbytes > SMALL_READ:
            return None
        try:
            return self._small(ref)
        except (OSError, ValueError, zipfile.BadZipFile):
            return None


def _decode(value: Any) -> str:
    return value.decode("ascii") if isinstance(value, bytes) else str(value)


def _storage_ref(storages: dict[str, StorageRef], stype: Any, key: Any, location: Any, numel: Any) -> StorageRef:
    if not isinstance(stype, _StorageType) or not isinstance(numel, int) or numel < 0:
        raise pickle.UnpicklingError(f"malformed storage record for key {key!r}")
    key = _decode(key)
    ref = storages.get(key)
    if ref is None:
        ref = storages[key] = StorageRef(key, _decode(location), stype.dtype, numel)
    return ref


def _read_zip(fh: IO[bytes], size: int, label: str, reopen: Callable[[], IO[bytes]]) -> PickleFile:
    try:
        zf = zipfile.ZipFile(fh)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise CheckpointError(f"{label}: truncated or corrupted zip archive, no readable directory ({exc})") from None
    names = zf.namelist()
    pkl = [n for n in names if n.endswith("data.pkl") and n.count("/") == 1]
    if not pkl:
        raise CheckpointError(f"{label}: zip archive without <archive>/data.pkl: not a torch.save file")
    prefix = pkl[0][: -len("data.pkl")]
    fmt = "torchscript" if any(n.startswith(prefix + "code/") for n in names) else "torch-zip"
    info = zf.getinfo(pkl[0])
    if info.file_size > _MAX_PICKLE_BYTES:
        raise CheckpointError(f"{label}: data.pkl is {info.file_size} bytes, too large to inspect")
    try:
        data = zf.read(info)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise CheckpointError(f"{label}: corrupted data.pkl ({exc})") from None
    storages: dict[str, StorageRef] = {}

    def persistent(pid: Any) -> Any:
        if not isinstance(pid, tuple) or len(pid) != 5 or _decode(pid[0]) != "storage":
            raise pickle.UnpicklingError(f"unexpected persistent id {str(pid)[:60]}")
        return _storage_ref(storages, *pid[1:])

    root, unknown = _unpickle(data, persistent, label)
    notes = []
    if prefix + "byteorder" in names and zf.read(prefix + "byteorder").strip() == b"big":
        notes.append("saved on a big-endian machine")
    entries = {i.filename: i for i in zf.infolist()}
    for ref in storages.values():
        entry = entries.get(f"{prefix}data/{ref.key}")
        if entry is None:
            raise CheckpointError(f"{label}: corrupted: storage {prefix}data/{ref.key} is missing from the archive")
        if entry.file_size < ref.nbytes or entry.header_offset + entry.file_size > size:
            raise CheckpointError(
                f"{label}: truncated or corrupted: storage data/{ref.key} has {entry.file_size} bytes, "
                f"needs {ref.nbytes}"
            )

    def small(ref: StorageRef) -> bytes | None:
        with reopen() as f, zipfile.ZipFile(f) as z:  # the scan's own handle is closed by now
            return z.read(f"{prefix}data/{ref.key}")[: ref.nbytes]

    return PickleFile(fmt, root, storages, unknown, notes, small)


def _unpickle(
    data: bytes | IO[bytes], persistent: Callable[[Any], Any] | None, label: str
) -> tuple[Any, tuple[str, ...]]:
    fh = io.BytesIO(data) if isinstance(data, bytes) else data
    unpickler = SafeUnpickler(fh, persistent)
    try:
        root = unpickler.load()
    except CheckpointError:
        raise
    except EOFError:
        raise CheckpointError(f"{label}: truncated pickle (ran out of data)") from None
    except Exception as exc:  # any failure inside a hostile or damaged pickle is "corrupted", never a traceback
        raise CheckpointError(f"{label}: corrupted pickle ({type(exc).__name__}: {str(exc)[:120]})") from None
    return root, tuple(unpickler.unknown)


def _read_legacy(fh: IO[bytes], size: int, label: str, reopen: Callable[[], IO[bytes]]) -> PickleFile:
    first, unknown = _unpickle(fh, None, label)
    if first != _LEGACY_MAGIC:  # a plain pickle (pickle.dump of a dict): no storages can follow
        fmt = "pickle"
        return PickleFile(fmt, first, {}, unknown, ["plain pickle, not torch.save"])
    protocol, _ = _unpickle(fh, None, label)
    if protocol != _LEGACY_PROTOCOL:
        raise CheckpointError(f"{label}: legacy torch file with unknown protocol {protocol!r}")
    sys_info, _ = _unpickle(fh, None, label)
    storages: dict[str, StorageRef] = {}
    views: dict[str, StorageRef] = {}

    def persistent(pid: Any) -> Any:
        if not isinstance(pid, tuple) or not pid:
            raise pickle.UnpicklingError("unexpected persistent id")
        kind = _decode(pid[0])
        if kind == "module":  # a pickled nn.Module class with its source; the class is already a placeholder
            return pid[1]
        if kind != "storage" or len(pid) != 6:
            raise pickle.UnpicklingError(f"unexpected persistent id {str(pid)[:60]}")
        ref = _storage_ref(storages, *pid[1:5])
        view = pid[5]
        if view is None:
            return ref
        view_key, offset, view_size = view
        key = _decode(view_key)
        return views.setdefault(key, StorageRef(key, ref.location, ref.dtype, int(view_size)))

    root, unknown2 = _unpickle(fh, persistent, label)
    keys, _ = _unpickle(fh, None, label)
    if not isinstance(keys, list) or any(_decode(k) not in storages for k in keys):
        raise CheckpointError(f"{label}: corrupted legacy torch file (storage key list does not match)")
    offsets: dict[str, int] = {}
    pos = fh.tell()
    for k in keys:  # each storage: 8-byte element count, then its bytes; skipped by arithmetic
        ref = storages[_decode(k)]
        offsets[ref.key] = pos + 8
        pos += 8 + ref.nbytes
    if pos > size:
        raise CheckpointError(f"{label}: truncated: storage data needs {pos} bytes, the file has {size}")
    notes = []
    if isinstance(sys_info, dict) and sys_info.get("little_endian") is False:
        notes.append("saved on a big-endian machine")

    def small(ref: StorageRef) -> bytes | None:
        with reopen() as f:
            f.seek(offsets[ref.key])
            return f.read(ref.nbytes)

    return PickleFile("torch-legacy", root, storages, tuple(dict.fromkeys(unknown + unknown2)), notes, small)


def read_torch_file(path: str | os.PathLike[str], fh: IO[bytes], size: int, label: str) -> PickleFile:
    """Read a ``torch.save`` file (zip or legacy) or a plain pickle from an open binary file, without its data."""
    fh.seek(0)
    head = fh.read(512)
    fh.seek(0)
    def reopen() -> IO[bytes]:
        return open(path, "rb")

    if head.startswith(b"PK"):
        return _read_zip(fh, size, label, reopen)
    if head[257:262] == b"ustar":
        raise CheckpointError(f"{label}: tar-format checkpoint from torch < 0.4: unsupported, re-save with torch.save")
    if head[:1] == b"\x80":
        return _read_legacy(fh, size, label, reopen)
    raise CheckpointError(f"{label}: not a checkpoint (unknown format, starts with {head[:8]!r})")


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
        if isinstance(obj, TensorStub):
            children = ((join(path, k), v) for k, v in obj.attrs.items())
        elif isinstance(obj, dict):
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
