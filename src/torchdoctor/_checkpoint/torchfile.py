"""Read ``torch.save`` files (and plain pickles) as records, without their data and without running their code.

Both container formats are read here: the zip format (``archive/data.pkl`` plus one entry per storage, sizes
taken from the zip directory) and the legacy stream (magic number, protocol, sys info, the main pickle, the
storage keys, then raw storage data that is skipped by arithmetic, never read). Plain pickles
(``pickle.dump(state_dict)``) work too: each storage inside is a small embedded legacy stream, read the same way.
Every pickle goes through the restricted unpickler of :mod:`torchdoctor._checkpoint.unpickle`; :func:`walk` then follows
the records it built (stubs, placeholders, containers), which the object walker of :mod:`torchdoctor._walk`
never sees.
"""

from __future__ import annotations

import gc
import io
import itertools
import os
import pickle
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import IO, Any

from torchdoctor._checkpoint.unpickle import (
    CheckpointError,
    Placeholder,
    SafeUnpickler,
    StorageRef,
    TensorStub,
    _placeholder_class,
    _StorageType,
)

__all__ = ["SMALL_READ", "PickleFile", "WalkResult", "gc_paused", "read_torch_file", "safe_loads", "walk"]

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001
_MAX_PICKLE_BYTES = 1 << 30  # a data.pkl larger than this is not a state dict anyone can inspect usefully
SMALL_READ = 4096  # the only tensor bytes ever read: bitsandbytes' packed JSON quant_state


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
    unpickler = SafeUnpickler(fh, persistent, _load_from_bytes)
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
    return SafeUnpickler(io.BytesIO(data), nested=_load_from_bytes).load()


@contextmanager
def gc_paused() -> Iterator[None]:
    """Unpickling builds many small objects; the cyclic GC would rescan the whole heap (torch's included)
    several times for a 4,000-tensor pickle, tripling the scan time. Nothing a scan builds forms cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


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
        if isinstance(obj, TensorStub):
            children = ((join(path, k), v) for k, v in obj.attrs.items())
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
