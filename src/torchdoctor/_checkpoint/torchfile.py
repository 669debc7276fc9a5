"""Read ``torch.save`` files (and plain pickles) as records, without their data and without running their code.

The file is dispatched as ``torch.load`` dispatches it: a zip when it starts with a local header
(:mod:`torchdoctor._checkpoint.torchzip`), else a tar when tarfile's header test passes
(:mod:`torchdoctor._checkpoint.tarcheck`), else the legacy stream read here (magic number, protocol, sys info, the
main pickle, the storage keys, then raw storage data skipped by arithmetic, never read). Plain pickles
(``pickle.dump(state_dict)``) work too: each storage inside is a small embedded legacy stream, read the same way;
a pickle followed by more bytes is not plain. Every pickle goes through :func:`torchdoctor._checkpoint.pickles.
unpickle_one` (bounded pre-scan, then the restricted unpickler). Every failure of a format read here becomes a
one-line :class:`CheckpointError`.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable
from typing import IO, Any

from torchdoctor._checkpoint.bounds import _KINDS, MAX_PICKLE_BYTES, Budget
from torchdoctor._checkpoint.errors import LFS_POINTER, SMALL_READ
from torchdoctor._checkpoint.modclass import merge
from torchdoctor._checkpoint.pickles import PickleFile, decode, set_stream_reader, storage_ref, unpickle_one
from torchdoctor._checkpoint.unpickle import CheckpointError, StorageRef, StorageType, UnsafePickle

__all__ = ["LFS_POINTER", "SMALL_READ", "ZIP_MAGIC", "PickleFile", "read_stream", "read_torch_file", "safe_loads",
           "storage_ref", "unpickle_one"]

_unpickle = unpickle_one
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001
ZIP_MAGIC = b"PK\x03\x04"  # torch.load's own test (_is_zipfile): a zip is a file that starts with a local header
_LEGACY_WINDOW = 4 * 1024 * 1024  # first read of a legacy file's pickles; grown x16 while a pickle runs past it


def _read_legacy(fh: IO[bytes], size: int, label: str, reopen: Callable[[], IO[bytes]], budget: Budget) -> PickleFile:
    """Only the head of the file holding its pickles is read, never the storage data behind them: a window
    that grows x16 while a pickle runs past it."""
    window = _LEGACY_WINDOW
    while True:
        fh.seek(0)
        data = fh.read(min(size, window))
        attempt = budget.copy()
        try:
            result = _parse_legacy(data, size, label, reopen, attempt)
        except CheckpointError as exc:
            if len(data) >= size or "truncated pickle" not in str(exc):
                raise
            if window >= MAX_PICKLE_BYTES:
                raise CheckpointError(f"{label}: refused: the pickles of this legacy file run past "
                                      f"{MAX_PICKLE_BYTES:,} bytes") from None
            window *= 16
            continue
        budget.ops = attempt.ops
        return result


def _parse_legacy(data: bytes, size: int, label: str, reopen: Callable[[], IO[bytes]], budget: Budget) -> PickleFile:
    """All five pickles go through the restricted reader: ``torch.load(weights_only=False)`` unpickles every one,
    so a global in the magic-number, protocol, sys-info or storage-keys pickle is found like one in the main one."""
    first, unknown, pos = _unpickle(data, 0, None, label, budget)
    if first != _LEGACY_MAGIC:  # a plain pickle (pickle.dump of a dict): no storages can follow
        if pos < size:  # pickle.load reads the first pickle only; whatever follows is not a plain pickle's
            why = (f"refused: a pickle of {pos:,} bytes followed by {size - pos:,} more bytes: not a plain pickle "
                   "(pickle.load reads only the first) and not a torch.save file")
            if unknown:
                raise UnsafePickle(f"{label}: {why}", unknown)
            raise CheckpointError(f"{label}: {why}")
        return PickleFile("pickle", first, {}, unknown, ["plain pickle, not torch.save"])
    protocol, more, pos = _unpickle(data, pos, None, label, budget)
    unknown += more
    if protocol != _LEGACY_PROTOCOL:
        if unknown:
            return _header_payload(unknown, "protocol")
        raise CheckpointError(f"{label}: legacy torch file with unknown protocol {str(protocol)[:40]}")
    sys_info, more, pos = _unpickle(data, pos, None, label, budget)
    unknown += more
    storages: dict[str, StorageRef] = {}
    views: dict[str, StorageRef] = {}

    def persistent(pid: Any) -> Any:
        if not isinstance(pid, tuple) or not pid:
            raise pickle.UnpicklingError("unexpected persistent id")
        kind = pid[0] if type(pid[0]) is str else decode(pid[0])
        if kind == "module":  # a pickled nn.Module class with its source; the class is already a placeholder
            return pid[1]
        if kind != "storage" or len(pid) != 6:
            raise pickle.UnpicklingError(f"unexpected persistent id {str(pid)[:60]}")
        _, stype, key, location, numel, view = pid
        if not isinstance(stype, StorageType) or type(numel) is not int or numel < 0:  # storage_ref, inlined:
            raise pickle.UnpicklingError(f"malformed storage record for key {str(key)[:40]!r}")  # once per tensor
        if type(key) is not str:
            key = decode(key)
        ref = storages.get(key)
        if ref is None:
            ref = storages[key] = StorageRef(key, location if type(location) is str else decode(location),
                                             stype.dtype, numel)
        if view is None:
            return ref
        view_key, offset, view_size = view
        key = decode(view_key)
        return views.setdefault(key, StorageRef(key, ref.location, ref.dtype, int(view_size)))

    root, more, pos = _unpickle(data, pos, persistent, label, budget)
    unknown += more
    keys, more, end = _unpickle(data, pos, None, label, budget)
    unknown += more
    if not isinstance(keys, list) or not all(isinstance(k, (str, bytes)) for k in keys):
        if more:
            return _header_payload(unknown, "storage-keys", root)
        raise CheckpointError(f"{label}: corrupted legacy torch file (the storage key list is not a list of keys)")
    listed = [decode(k) for k in keys]
    if sorted(listed) != sorted(storages):
        missing = sorted(set(storages) - set(listed))[:3]
        extra = sorted(set(listed) - set(storages))[:3]
        raise CheckpointError(
            f"{label}: corrupted legacy torch file: its storage key list does not match the storages its pickle "
            f"uses (not listed: {missing or 'none'}; listed but unused or twice: {extra or 'none'})"
        )
    offsets: dict[str, int] = {}
    pos = end
    for key in listed:  # each storage: 8-byte element count, then its bytes; skipped by arithmetic
        ref = storages[key]
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

    return PickleFile("torch-legacy", root, storages, merge(unknown), notes, small)


def _header_payload(unknown: tuple[str, ...], which: str, root: Any = None) -> PickleFile:
    """A legacy file whose bookkeeping pickle calls globals instead of holding its value: what it names is the
    finding (storage data is not located)."""
    note = f"the {which} pickle of this legacy torch.save file calls globals instead of holding its value"
    return PickleFile("torch-legacy", root, {}, merge(unknown), [note])


def read_torch_file(path: str | os.PathLike[str], fh: IO[bytes], size: int, label: str) -> PickleFile:
    """Read a ``torch.save`` file (zip or legacy) or a plain pickle from an open binary file, without its data."""
    fh.seek(0)
    head = fh.read(512)
    fh.seek(0)

    def reopen() -> IO[bytes]:
        return open(path, "rb")

    budget = Budget(label=label)
    if head.startswith(ZIP_MAGIC):
        from torchdoctor._checkpoint.torchzip import read_zip_file

        return read_zip_file(fh, size, label, reopen, budget)
    from torchdoctor._checkpoint.tarcheck import looks_like_tar

    if looks_like_tar(head):  # torch.load(weights_only=False) tries tarfile first on every other file: so does this
        from torchdoctor._checkpoint.tarcheck import read_tar

        tar = read_tar(fh, size, label, budget, lambda: _pickle_view(fh, size, label, reopen))
        if tar is not None:
            return tar
        fh.seek(0)
    if head[:1] == b"\x80":
        return _read_legacy(fh, size, label, reopen, budget)
    if head.startswith(LFS_POINTER):
        raise CheckpointError(f"{label}: a git-LFS pointer, not the checkpoint itself: run `git lfs pull`")
    if _KINDS[head[0]] is not None:  # protocol 0 and 1 pickles have no PROTO opcode: read them the same way
        try:
            return _read_legacy(fh, size, label, reopen, budget)
        except UnsafePickle:
            raise
        except CheckpointError as exc:
            why = str(exc).removeprefix(f"{label}: ")
            raise CheckpointError(f"{label}: not a checkpoint (unknown format, starts with {head[:8]!r}; read as a "
                                  f"protocol 0/1 pickle: {why[:120]})") from None
    raise CheckpointError(f"{label}: not a checkpoint (unknown format, starts with {head[:8]!r})")


def _pickle_view(fh: IO[bytes], size: int, label: str, reopen: Callable[[], IO[bytes]]) -> tuple[str, ...]:
    """What ``pickle.load`` (and torch.load, when tarfile gives up) would import from the file's first bytes."""
    try:
        return _read_legacy(fh, size, label, reopen, Budget(label=label)).unknown_globals
    except UnsafePickle as exc:
        return exc.globals
    except CheckpointError:
        return ()


def read_stream(raw: bytes, label: str, budget: Budget | None = None) -> PickleFile:
    """A ``torch.save`` stream held in memory, read as ``torch.load(io.BytesIO(raw))`` reads it: a zip when it
    starts with a local header, else the legacy pickles (an in-memory stream is never tried as a tar)."""
    budget = budget if budget is not None else Budget(label=label)
    if raw.startswith(ZIP_MAGIC):
        from torchdoctor._checkpoint.torchzip import read_zip_file

        return read_zip_file(io.BytesIO(raw), len(raw), label, lambda: io.BytesIO(raw), budget)  # type: ignore[no-any-return]
    return _read_legacy(io.BytesIO(raw), len(raw), label, lambda: io.BytesIO(raw), budget)


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
    return _unpickle(bytes(data), 0, None, "pickle", Budget(label="pickle"))[0]


set_stream_reader(read_stream)  # how pickles.py reads a storage embedded as a stream (no import circle)
