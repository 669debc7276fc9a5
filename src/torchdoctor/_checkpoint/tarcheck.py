"""Checkpoints of torch < 0.4: a tar archive of three members, recognised as ``torch.load`` recognises one.

``torch.load(weights_only=False)`` opens every file that is not a zip with :mod:`tarfile` first (any header whose
checksum matches: the old v7 format without the ``ustar`` magic as well as ustar), and only when tarfile gives
up reads the file as pickles. From a tar it unpickles, with the full :mod:`pickle`, the pickles of member
``storages`` (a count, then per storage its record and raw bytes, then the views), of ``tensors`` (a count, then
per tensor its record and raw sizes) and of ``pickle`` (the object). Each is read here by the restricted
unpickler, every copy of a name; a member that is a link (``tar.extract`` would follow it to a file this scan
cannot see) is refused by name. The tensors are not listed: the verdict is what those pickles would import.
``pickle.load`` of the same file reads its first bytes as a pickle: that view is judged too.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import IO, Any

from torchdoctor._checkpoint.bounds import MAX_PICKLE_BYTES, BoundedFile, Budget
from torchdoctor._checkpoint.modclass import merge
from torchdoctor._checkpoint.errors import CheckpointError, UnsafePickle
from torchdoctor._checkpoint.unpickle import StorageType, placeholder_class

__all__ = ["MEMBERS", "looks_like_tar", "read_tar"]

MEMBERS = ("storages", "tensors", "pickle")  # what torch's legacy_load extracts, in that order
_MAX_MEMBERS = 100_000  # tarfile reads every header before the first extract: a bound on that walk
_MAX_RECORDS = 100_000  # storages or tensors one member may declare (a torch < 0.4 model had hundreds)
_WINDOW = 1024 * 1024


def looks_like_tar(head: bytes) -> bool:
    """tarfile's own test of a first header (``TarInfo.frombuf``): 512 bytes, not all zero, whose checksum field
    holds the unsigned or the signed sum of the block. Cheap, so tarfile is imported only for a real candidate.

    >>> looks_like_tar(bytes(512)), looks_like_tar(b"\\x80\\x02" + bytes(600))
    (False, False)
    """
    if len(head) < 512:
        return False
    block = head[:512]
    if block.count(0) == 512:
        return False
    field = block[148:156]
    if field[0] in (0o200, 0o377):  # base-256, as tarfile's nti reads it
        stored = int.from_bytes(field[1:], "big")
        if field[0] == 0o377:
            stored -= 256 ** 7
    else:
        text = field.split(b"\x00", 1)[0]
        try:
            stored = int(text.decode("ascii").strip() or "0", 8)
        except (UnicodeDecodeError, ValueError):
            return False
    unsigned = 256 + sum(block[:148]) + sum(block[156:])
    signed = 256 + sum(struct.unpack_from("148b", block)) + sum(struct.unpack_from("356b", block, 156))
    return stored in (unsigned, signed)


def _any_persistent(pid: Any) -> Any:
    """The object pickle of a tar refers to storages and tensors by key: any record stands for one."""
    return placeholder_class("torch storage record")()


class _Member:
    """One regular member read as torch reads it: pickles one after the other, raw bytes skipped by arithmetic."""

    def __init__(self, f: IO[bytes], size: int, label: str, budget: Budget, unknown: list[str]) -> None:
        self.f, self.size, self.label, self.budget, self.unknown = f, size, label, budget, unknown

    def pickle_at(self, offset: int) -> tuple[Any, int]:
        from torchdoctor._checkpoint.pickles import unpickle_one

        window = _WINDOW
        while True:
            self.f.seek(offset)
            data = self.f.read(min(window, self.size - offset))
            try:
                obj, more, end = unpickle_one(data, 0, _any_persistent, self.label, self.budget)
            except UnsafePickle as exc:
                self.unknown += exc.globals
                raise
            except CheckpointError as exc:
                if "truncated pickle" in str(exc) and len(data) < self.size - offset and window < MAX_PICKLE_BYTES:
                    window *= 16
                    continue
                raise
            self.unknown += more
            return obj, offset + end

    def raw(self, offset: int, n: int) -> bytes:
        self.f.seek(offset)
        data = self.f.read(n)
        if len(data) != n:
            raise CheckpointError(f"{self.label}: truncated")
        return data


def _count(value: Any, label: str) -> int:
    if type(value) is not int or not 0 <= value <= _MAX_RECORDS:
        raise CheckpointError(f"{label}: not a count of records")
    return value


def _storages(m: _Member) -> None:
    count, off = m.pickle_at(0)
    for _ in range(_count(count, m.label)):
        record, off = m.pickle_at(off)
        if not isinstance(record, tuple) or len(record) != 3 or not isinstance(record[2], StorageType):
            raise CheckpointError(f"{m.label}: a storage record torch.load cannot use")
        numel = struct.unpack("<q", m.raw(off, 8))[0]
        off += 8 + max(numel, 0) * record[2].dtype.itemsize
    m.pickle_at(off)  # the storage views


def _tensors(m: _Member) -> None:
    count, off = m.pickle_at(0)
    for _ in range(_count(count, m.label)):
        _, off = m.pickle_at(off)
        ndim = struct.unpack("<i", m.raw(off, 4))[0]
        off += 8 + 16 * max(ndim, 0) + 8  # ndim, 4 bytes of padding, sizes, strides, storage offset


def _whole(m: _Member) -> None:
    m.pickle_at(0)


_READERS: dict[str, Callable[[_Member], None]] = {"storages": _storages, "tensors": _tensors, "pickle": _whole}


def read_tar(fh: IO[bytes], size: int, label: str, budget: Budget, pickle_view: Callable[[], tuple[str, ...]]) -> Any:
    """The globals torch.load(weights_only=False) would import from a tar checkpoint, as a PickleFile; None when
    tarfile does not open the file (torch.load then reads it as pickles, and so does the caller)."""
    import tarfile

    from torchdoctor._checkpoint.pickles import PickleFile

    fh.seek(0)
    members = []
    try:
        tar = tarfile.open(fileobj=BoundedFile(fh, size), mode="r:")  # type: ignore[call-overload]
        while (info := tar.next()) is not None:
            members.append(info)
            if len(members) > _MAX_MEMBERS:
                raise CheckpointError(f"{label}: refused: a tar archive of more than {_MAX_MEMBERS:,} members")
    except (tarfile.TarError, EOFError, OSError, ValueError, UnicodeError):
        return None  # torch.load's tarfile gives up here too, and reads the file's pickles
    unknown: list[str] = []
    refusals: list[str] = []
    for info in members:
        if info.name not in _READERS:
            continue
        if not info.isreg():
            kind = "a symlink" if info.issym() else "a hard link" if info.islnk() else "not a regular file"
            target = f" to {info.linkname[:120]!r}" if info.issym() or info.islnk() else ""
            refusals.append(f"tar member {info.name!r} is {kind}{target}: torch.load(weights_only=False) would "
                            "unpickle what it points to, which this scan cannot see")
            continue
        f = tar.extractfile(info)
        if f is None:
            continue
        try:
            _READERS[info.name](_Member(f, info.size, f"{label}: {info.name}", budget, unknown))
        except CheckpointError as exc:  # torch.load stops here too; what was named before still counts
            refusals.append(str(exc).removeprefix(f"{label}: ")[:200])
    unknown += pickle_view()
    named = merge(unknown)
    found = {i.name for i in members}
    missing = [n for n in MEMBERS if n not in found]
    if missing and not refusals:
        refusals.append(f"a tar archive without member(s) {', '.join(missing)}: torch.load fails on it")
    why = "tar-format checkpoint from torch < 0.4" + (f": refused: {'; '.join(refusals[:3])}" if refusals else "")
    if refusals and named:
        raise UnsafePickle(f"{label}: {why}", named)
    if refusals or not named:
        raise CheckpointError(f"{label}: {why}" + ("" if refusals else
                              ": its pickles name no global that can run code, but its tensors are not read; "
                              "torch.load(weights_only=True) refuses the format: load it once and re-save it "
                              "with torch.save"))
    note = ("tar-format checkpoint from torch < 0.4: torch.load(weights_only=False) unpickles its members "
            "storages, tensors and pickle (tensors not listed)")
    return PickleFile("torch-tar", None, {}, named, [note])
