"""The pickles of a checkpoint, read one at a time: what every container reader shares.

:class:`PickleFile` is what a container reader (``torchfile`` for legacy streams and plain pickles, ``torchzip``
for zips, ``tarcheck`` for torch < 0.4 tars, ``pt2`` for torch.export archives) returns; :func:`unpickle_one` reads
one pickle, first walked by :func:`torchdoctor._checkpoint.bounds.prescan`, then built by the restricted unpickler.
A storage embedded as a small ``torch.save`` stream (``torch.storage._load_from_bytes``) is read by the stream
reader ``torchfile`` registers here at import (:func:`set_stream_reader`), so no reader imports another in a
circle.
"""

from __future__ import annotations

import functools
import io
import itertools
import pickle
from collections.abc import Callable
from typing import Any

from torchdoctor._checkpoint.bounds import BLOB_COST, MAX_EMBEDDED, MAX_OPS, Budget, prescan
from torchdoctor._checkpoint.errors import SMALL_READ
from torchdoctor._checkpoint.modclass import ModuleClassName, stand_in
from torchdoctor._checkpoint.names import DATA_TYPES, LIBRARY_CLASSES
from torchdoctor._checkpoint.unpickle import (
    CheckpointError,
    Placeholder,
    SafeUnpickler,
    SlowUnpickler,
    StorageRef,
    StorageType,
    UnsafePickle,
    placeholder_class,
)
from torchdoctor._checkpoint.views import BadRecord

__all__ = ["PickleFile", "decode", "read_nested", "set_stream_reader", "storage_ref", "unpickle_one"]

_STREAM_READER: list[Callable[[bytes, str, Budget], Any]] = []


def set_stream_reader(reader: Callable[[bytes, str, Budget], Any]) -> None:
    """``torchfile.read_stream``, registered by that module: how an in-memory torch.save stream is read."""
    _STREAM_READER[:] = [reader]


def read_nested(raw: bytes, label: str, budget: Budget) -> Any:
    """An in-memory ``torch.save`` stream as ``torch.load(io.BytesIO(raw))`` reads it (a PickleFile)."""
    if not _STREAM_READER:  # every reader that gets here was reached through torchfile, which registers it
        raise CheckpointError(f"{label}: no reader for an embedded torch.save stream")
    return _STREAM_READER[0](raw, label, budget)


class PickleFile:
    """One ``torch.save`` file as read without its data (``format``: "torch-zip", "torch-legacy", "torchscript",
    "pickle")."""

    __slots__ = ("format", "root", "storages", "unknown_globals", "notes", "_small")

    def __init__(self, format: str, root: Any, storages: dict[str, StorageRef], unknown_globals: tuple[str, ...],
                 notes: list[str] | None = None, _small: Callable[[StorageRef], bytes | None] | None = None) -> None:
        self.format = format
        self.root = root
        self.storages = storages
        self.unknown_globals = unknown_globals
        self.notes = [] if notes is None else notes
        self._small = _small

    def read_small(self, ref: StorageRef) -> bytes | None:
        """Bytes of a tiny storage (at most ``SMALL_READ``), or None; nothing larger is ever read."""
        if ref.nbytes > SMALL_READ:
            return None
        if self._small is None:
            return None
        try:
            return self._small(ref)
        except Exception:  # a storage that cannot be read is simply not inspected further
            return None


def decode(value: Any) -> str:
    return value.decode("ascii") if isinstance(value, bytes) else str(value)


def storage_ref(storages: dict[str, StorageRef], stype: Any, key: Any, location: Any, numel: Any) -> StorageRef:
    if not isinstance(stype, StorageType) or type(numel) is not int or numel < 0:
        raise pickle.UnpicklingError(f"malformed storage record for key {str(key)[:40]!r}")
    key = decode(key)
    ref = storages.get(key)
    if ref is None:
        ref = storages[key] = StorageRef(key, decode(location), stype.dtype, numel)
    return ref


def _unpickle(
    data: bytes, start: int, persistent: Callable[[Any], Any] | None, label: str, budget: Budget
) -> tuple[Any, tuple[str, ...], int]:
    """One pickle of ``data`` from ``start``: checked by :func:`prescan`, then built; also where it ends."""
    end = prescan(data, start, budget, label)
    slow = budget.ext
    while True:
        fh = io.BytesIO(data)
        fh.seek(start)
        kind = SlowUnpickler if slow else SafeUnpickler
        unpickler = kind(fh, persistent, functools.partial(_load_from_bytes, budget), budget.hashes)
        try:
            return unpickler.load(), unpickler.names(), end
        except CheckpointError:
            raise
        except EOFError:
            failure = "truncated pickle (ran out of data)"
        except Exception as exc:  # any failure inside a hostile or damaged pickle is "corrupted", never a traceback
            if not slow and "STACK_GLOBAL" in str(exc):  # the C unpickler does not say what computed the name
                slow = True
                continue
            failure = (f"refused: {str(exc)[:260]}" if isinstance(exc, BadRecord)
                       else f"corrupted pickle ({type(exc).__name__}: {str(exc)[:160]})")
        named = tuple(g for g in unpickler.names() if g not in DATA_TYPES and g not in LIBRARY_CLASSES)
        if named:  # torch.load would have imported (and called) these before failing: that is the finding
            raise UnsafePickle(f"{label}: {failure}", unpickler.names())
        raise CheckpointError(f"{label}: {failure}")


unpickle_one = _unpickle


_PICKLED_STORAGES = itertools.count()


def _load_from_bytes(budget: Budget, unknown: dict[str, type[Placeholder]], data: Any) -> Any:
    """``pickle.dumps(tensor)`` embeds each storage as a small ``torch.save`` stream: read it the same way,
    on the same budget, one level deeper. Globals it names are recorded in the outer unpickler's ``unknown``."""
    if not isinstance(data, (bytes, bytearray)):
        raise pickle.UnpicklingError("_load_from_bytes without bytes")
    if budget.depth >= MAX_EMBEDDED:
        from torchdoctor._checkpoint.deepnames import names_in

        why = (f"refused: storage blobs (torch.storage._load_from_bytes) nested more than {MAX_EMBEDDED} deep; "
               "pickle.dumps of a tensor needs one level")
        named = names_in(bytes(data))  # not built, but what torch.load would import down there is still named
        if named:
            raise UnsafePickle(f"{budget.label}: {why}", named)
        raise CheckpointError(f"{budget.label}: {why}")
    cached = budget.blobs.get(id(data))
    if cached is not None and cached[0] is data:  # the same blob again through the memo: the same storage
        return cached[1]
    budget.ops -= BLOB_COST  # parsing a blob costs far more than its opcodes: bound the count of blobs too
    if budget.ops < 0:
        raise CheckpointError(f"{budget.label}: refused: more storage blobs (torch.storage._load_from_bytes) "
                              f"than {MAX_OPS // BLOB_COST:,}; a pickle that repeats work through its memo")
    raw = bytes(data)
    budget.depth += 1
    try:  # a damaged or refused blob is reported as such (its CheckpointError names the file)
        inner = read_nested(raw, f"{budget.label}: embedded storage", budget)
    finally:
        budget.depth -= 1
    for name in inner.unknown_globals:
        if not isinstance(name, ModuleClassName):  # a misuse below is a misuse here
            unknown[name] = placeholder_class(name)
        elif name not in unknown:
            unknown[name] = stand_in(str(name), set())
    result = inner.root
    if isinstance(result, StorageRef):
        result = result.with_key(f"pickled-{next(_PICKLED_STORAGES)}")  # each blob is its own storage
    budget.blobs[id(data)] = (data, result)  # keeps ``data`` alive, so its id is not reused
    return result
