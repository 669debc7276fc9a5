"""Checks on a zip archive made before its members are read: what ``zipfile`` would fail on, or sizes no
``torch.save`` archive has (one line each, as :class:`CheckpointError`). ``check_member`` reads a ``ZipInfo`` or
a :class:`torchdoctor._checkpoint.zipfast.Member` (zipfile is imported only where an archive needs it)."""

from __future__ import annotations

from typing import IO, TYPE_CHECKING, Any

from torchdoctor._checkpoint.errors import CheckpointError

if TYPE_CHECKING:
    import zipfile

__all__ = ["MAX_ZIP_DIRECTORY", "check_directory", "check_end", "check_member", "odd_members", "raw_member", "read_member"]

_ZIP_METHODS = {0: "stored", 8: "deflated"}  # ZIP_STORED, ZIP_DEFLATED: what torch.load can read
_MAX_ZIP_VERSION = 63
MAX_ZIP_DIRECTORY = 32 * 1024 * 1024  # ~300,000 storages; torch.save writes one entry per storage


def check_member(info: Any, label: str, limit: int | None) -> None:
    """Refuse a zip member before reading it: what zipfile would raise on, or more bytes than ``limit``."""
    name = info.filename
    if info.flag_bits & 0x1:
        raise CheckpointError(f"{label}: zip member {name} is encrypted; torch.load cannot read it")
    if info.compress_type not in _ZIP_METHODS:
        raise CheckpointError(
            f"{label}: zip member {name} uses compression method {info.compress_type}; torch.load reads only "
            "stored or deflated members"
        )
    if info.extract_version > _MAX_ZIP_VERSION:
        raise CheckpointError(f"{label}: corrupted zip: member {name} needs zip version {info.extract_version / 10}")
    if limit is not None and info.file_size > limit:
        raise CheckpointError(
            f"{label}: refused: zip member {name} declares {info.file_size:,} bytes, more than the {limit:,} "
            "such a member can hold"
        )


def read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, label: str, limit: int) -> bytes:
    check_member(info, label, limit)
    try:
        with zf.open(info) as member:
            return member.read(limit + 1)[:limit]
    except Exception as exc:  # zipfile, zlib and OS errors of a damaged archive: all one line
        raise CheckpointError(f"{label}: corrupted zip member {info.filename} ({type(exc).__name__}: "
                              f"{str(exc)[:100]})") from None


def check_directory(fh: IO[bytes], label: str) -> None:
    """zipfile builds one object per directory entry (~0.5 kB each): refuse a directory larger than any
    torch.save writes before it is parsed. Read from the end record alone."""
    import zipfile

    end_record = getattr(zipfile, "_EndRecData", None)
    try:
        record = end_record(fh) if end_record is not None else None
    except Exception:  # zipfile itself will say what is wrong with the archive
        return
    if record and (record[5] > MAX_ZIP_DIRECTORY or record[4] > MAX_ZIP_DIRECTORY // 46):
        raise CheckpointError(f"{label}: refused: a zip directory of {record[5]:,} bytes and {record[4]:,} entries, "
                              f"more than a torch.save archive holds (at most {MAX_ZIP_DIRECTORY:,} bytes)")


def _local_name(fh: IO[bytes], size: int, info: Any) -> tuple[bytes, int] | None:
    """The name written in a member's local header and where its data starts, or None without a local header."""
    import struct

    if info.header_offset + 30 > size:
        return None
    fh.seek(info.header_offset)
    head = fh.read(30)
    if len(head) != 30 or head[:4] != b"PK\x03\x04":
        return None
    n, extra = struct.unpack_from("<2H", head, 26)
    return fh.read(n), info.header_offset + 30 + n + extra


def odd_members(fh: IO[bytes], size: int, infos: list[Any]) -> list[str]:
    """What torch.save never writes and torch's reader resolves differently from zipfile: two entries whose names
    differ only in case or not at all (torch's lookup ignores case and may pick either), and a local header naming
    a member differently from the directory (torch reads it by the directory's name; zipfile refuses it)."""
    out: list[str] = []
    seen: dict[str, str] = {}
    for info in infos:
        key = info.filename.lower()
        if key in seen:
            same = "the same name" if seen[key] == info.filename else "names that differ only in case"
            out.append(f"two zip members with {same} ({seen[key]!r}, {info.filename!r}): torch's reader may pick "
                       "either")
        seen.setdefault(key, info.filename)
        local = _local_name(fh, size, info)
        want = info.filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437", "replace")
        if local is not None and local[0] != want and local[0].split(b"\x00", 1)[0] != want:
            out.append(f"zip member {info.filename!r} is named {local[0][:80]!r} in its local header: torch reads "
                       "it by the directory's name")
    return out


def raw_member(fh: IO[bytes], size: int, info: Any, limit: int) -> bytes:
    """A member's bytes as torch's reader takes them: from the local header's end, the directory's sizes, whatever
    name the local header writes; the checksum is checked as torch checks it."""
    import zlib

    check_member(info, "", limit)
    local = _local_name(fh, size, info)
    if local is None or local[1] + info.compress_size > size:
        raise CheckpointError(f"zip member {info.filename} has no readable local header")
    fh.seek(local[1])
    data = fh.read(info.compress_size)
    try:
        if info.compress_type == 8:
            inflater = zlib.decompressobj(-15)
            data = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise CheckpointError(f"zip member {info.filename}: {exc}") from None
    if len(data) > limit or zlib.crc32(data) != info.CRC:
        raise CheckpointError(f"zip member {info.filename}: bad size or checksum")
    return data


def check_end(fh: IO[bytes], size: int, label: str) -> None:
    """torch's reader refuses an archive followed by bytes past its end record and comment (zipfile reads it):
    a zip with a tar or a pickle appended is refused here too, by what follows it."""
    import zipfile

    end_record = getattr(zipfile, "_EndRecData", None)
    try:
        record = end_record(fh) if end_record is not None else None
    except Exception:  # zipfile itself will say what is wrong with the archive
        return
    if record:
        trailing = size - (record[9] + 22 + len(record[8]))
        if trailing > 0:
            raise CheckpointError(f"{label}: refused: {trailing:,} bytes follow the zip archive's end record; "
                                  "torch.save never writes them and torch.load refuses the file")
