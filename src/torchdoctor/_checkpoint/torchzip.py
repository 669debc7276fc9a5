"""The zip container of ``torch.save``, read as torch's own reader picks its members.

torch's reader (miniz) takes the archive's folder from the *first* directory entry, finds every record by a
case-insensitive binary search over the sorted directory (``archive/DATA.PKL`` answers for ``data.pkl``; of two
entries with one name it may pick either), and reads a member's bytes from its local header without comparing the
name written there. ``torch.save`` never writes duplicates or mismatched names; an archive holding them is judged
on every copy of every pickle (so a payload is named whichever copy torch picks) and then refused, naming why. A
TorchScript archive (a ``constants.pkl`` beside ``data.pkl``, torch's own test) goes to ``torch.jit.load``, whose
unpickler resolves ``__torch__.*`` names as classes compiled from the archive's ``code/``, never as imports.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import IO, Any

from torchdoctor._checkpoint.bounds import MAX_PICKLE_BYTES, MAX_SMALL_MEMBER, BoundedFile, Budget
from torchdoctor._checkpoint.dtypes import shown
from torchdoctor._checkpoint.modclass import merge
from torchdoctor._checkpoint.errors import SMALL_READ, CheckpointError, UnsafePickle
from torchdoctor._checkpoint.unpickle import StorageRef, StorageType, placeholder_class

__all__ = ["TORCHSCRIPT_PREFIX", "read_zip_file"]

TORCHSCRIPT_PREFIX = "__torch__."


def _zip_directory(fh: IO[bytes], size: int, label: str) -> tuple[dict[str, Any], Callable[[Any, int], bytes], list[str]]:
    """The archive's entries by name, a reader of one member, and what about the container torch.save never
    writes (duplicate names, local names that differ from the directory's): without zipfile when the archive is
    exactly the shape torch.save writes (``zipfast``), else through zipfile's directory parse."""
    from torchdoctor._checkpoint.zipcheck import MAX_ZIP_DIRECTORY, check_directory, check_end, odd_members, read_member
    from torchdoctor._checkpoint.zipfast import read_zip

    fast = read_zip(fh, size, MAX_ZIP_DIRECTORY, MAX_PICKLE_BYTES, MAX_SMALL_MEMBER)
    if fast is not None:
        contents = fast[1]
        return fast[0], lambda info, limit: contents[info.filename], []
    import zipfile  # here, not at the top: a legacy file, a plain pickle or a torch.save archive never needs it

    check_directory(BoundedFile(fh, size), label)  # type: ignore[arg-type]
    check_end(BoundedFile(fh, size), size, label)  # type: ignore[arg-type]
    try:
        zf = zipfile.ZipFile(BoundedFile(fh, size))  # type: ignore[arg-type]
        infos = zf.infolist()
    except Exception as exc:  # BadZipFile, but also ValueError/UnicodeDecodeError/struct.error on odd directories
        raise CheckpointError(f"{label}: truncated or corrupted zip archive, no readable directory "
                              f"({type(exc).__name__}: {str(exc)[:100]})") from None
    odd = odd_members(fh, size, infos)
    return {i.filename: i for i in infos}, lambda info, limit: read_member(zf, info, label, limit), odd


def _judge_every_copy(fh: IO[bytes], size: int, label: str, odd: list[str], budget: Budget) -> None:
    """An archive torch.save never writes: every member whose name ends in ``.pkl`` (any case, every copy) is
    read as torch reads it (by the directory's sizes, whatever its local name) and judged; then it is refused,
    naming what was odd. Always raises."""
    import zipfile

    from torchdoctor._checkpoint.pickles import unpickle_one
    from torchdoctor._checkpoint.zipcheck import raw_member

    why = f"refused: {'; '.join(odd[:3])}{f' (and {len(odd) - 3} more)' if len(odd) > 3 else ''}"
    unknown: list[str] = []
    for info in zipfile.ZipFile(BoundedFile(fh, size)).infolist():  # type: ignore[arg-type]
        if not info.filename.lower().endswith(".pkl"):
            continue
        try:
            data = raw_member(fh, size, info, MAX_PICKLE_BYTES)
            unknown += unpickle_one(data, 0, _any_persistent, f"{label}: {info.filename}", budget)[1]
        except UnsafePickle as exc:
            unknown += exc.globals
        except CheckpointError:  # a copy torch could not read either: it runs nothing
            continue
    named = tuple(g for g in merge(unknown) if not g.startswith(TORCHSCRIPT_PREFIX))
    if named:
        raise UnsafePickle(f"{label}: {why}", named)
    raise CheckpointError(f"{label}: {why}; torch.save never writes such an archive (its pickles name no global "
                          "that can run code)")


def _any_persistent(pid: Any) -> Any:
    """Persistent ids of a copy judged only for its globals: any record stands for a storage."""
    return placeholder_class("torch storage record")()


def read_zip_file(fh: IO[bytes], size: int, label: str, reopen: Callable[[], IO[bytes]], budget: Budget) -> Any:
    """A ``torch.save`` (or TorchScript) zip as a :class:`torchdoctor._checkpoint.torchfile.PickleFile`."""
    from torchdoctor._checkpoint.pickles import PickleFile, decode, storage_ref, unpickle_one
    from torchdoctor._checkpoint.zipcheck import check_member
    from torchdoctor._checkpoint.zipfast import SMALL_MEMBERS

    entries, read, odd = _zip_directory(fh, size, label)
    if odd:
        _judge_every_copy(fh, size, label, odd, budget)
    by_lower = {n.lower(): n for n in entries}  # torch finds records case-insensitively; no two names collide here
    first = next(iter(entries), "")
    if "/" not in first:
        raise CheckpointError(f"{label}: zip archive whose first entry {shown(first)} is not in a folder: not a "
                              "torch.save file (torch.load refuses it)")
    prefix = first[: first.index("/") + 1]
    stray = next((n for n in entries if not n.startswith(prefix)), None)
    if stray is not None:  # torch's reader checks every name against the first one's folder, case and all
        raise CheckpointError(f"{label}: zip member {shown(stray)} is not in the archive's folder {shown(prefix)}: "
                              "torch.load refuses the file")
    main = by_lower.get((prefix + "data.pkl").lower())
    if main is None and prefix + "archive_format" in entries:  # torch.export.save: read by its configs
        import zipfile

        from torchdoctor._checkpoint.pt2 import read_pt2
        from torchdoctor._checkpoint.zipcheck import read_member

        zf = zipfile.ZipFile(BoundedFile(fh, size))  # type: ignore[arg-type]  # every member, not only pickles
        return read_pt2({i.filename: i for i in zf.infolist()}, lambda info, limit: read_member(zf, info, label, limit),
                        prefix, label, budget)
    if main is None:
        raise CheckpointError(f"{label}: zip archive without {shown(prefix)}data.pkl: not a torch.save file")
    torchscript = prefix + "constants.pkl" in entries  # torch.load's own test (_is_torchscript_zip)
    fmt = "torchscript" if torchscript else "torch-zip"
    data = read(entries[main], MAX_PICKLE_BYTES)
    storages: dict[str, StorageRef] = {}

    def persistent(pid: Any) -> Any:
        if not isinstance(pid, tuple) or len(pid) != 5 or (pid[0] if type(pid[0]) is str else decode(pid[0])) \
                != "storage":
            raise pickle.UnpicklingError(f"unexpected persistent id {str(pid)[:60]}")
        _, stype, key, location, numel = pid
        if isinstance(stype, StorageType) and type(numel) is int and numel >= 0 and type(key) is str:
            ref = storages.get(key)  # storage_ref inlined for the common record: this runs once per tensor
            if ref is None:
                ref = storages[key] = StorageRef(key, location if type(location) is str else decode(location),
                                                 stype.dtype, numel)
            return ref
        return storage_ref(storages, stype, key, location, numel)

    root, unknown, _ = unpickle_one(data, 0, persistent, label, budget)
    for name in entries:  # TorchScript archives hold constants.pkl too; every other pickle is judged the same way
        if name.lower().endswith(".pkl") and name != main and name.count("/") == 1:
            _, more, _ = unpickle_one(read(entries[name], MAX_PICKLE_BYTES), 0, persistent, f"{label}: {name}", budget)
            unknown += more
    if torchscript:  # TorchScript class names, resolved from the archive's code/ by torch.jit.load, never imported
        unknown = tuple(g for g in unknown if not g.startswith(TORCHSCRIPT_PREFIX))
    unknown = merge(unknown)
    notes = []
    for small in SMALL_MEMBERS:
        member = by_lower.get((prefix + small).lower())
        if member is not None:
            value = read(entries[member], MAX_SMALL_MEMBER)
            if small == "byteorder" and value.strip() == b"big":
                notes.append("saved on a big-endian machine")
    if torchscript:
        notes.append("TorchScript archive: torch.load hands it to torch.jit.load; its __torch__.* names are "
                      "TorchScript classes compiled from the archive's code/, not Python imports")
    for ref in storages.values():
        found = by_lower.get(f"{prefix}data/{ref.key}".lower())
        entry = entries.get(found) if found is not None else None
        if entry is None:
            raise CheckpointError(f"{label}: corrupted: storage {shown(prefix + 'data/' + ref.key)} is missing from "
                                  "the archive")
        check_member(entry, label, None)
        if entry.file_size < ref.nbytes or entry.header_offset + entry.compress_size > size:
            raise CheckpointError(
                f"{label}: truncated or corrupted: storage {shown('data/' + ref.key)} has {entry.file_size} bytes, "
                f"needs {ref.nbytes}"
            )

    def read_small(ref: StorageRef) -> bytes | None:
        import zipfile

        from torchdoctor._checkpoint.zipcheck import read_member

        with reopen() as f, zipfile.ZipFile(BoundedFile(f, size)) as z:  # type: ignore[arg-type]
            name = by_lower.get(f"{prefix}data/{ref.key}".lower(), f"{prefix}data/{ref.key}")
            return read_member(z, z.getinfo(name), label, SMALL_READ)[: ref.nbytes]

    return PickleFile(fmt, root, storages, unknown, notes, read_small)
