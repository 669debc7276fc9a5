"""The zip archive ``torch.save`` writes, read without ``zipfile`` when it is exactly that shape.

``import zipfile`` (with the pathlib, shutil, threading, bz2 and lzma it imports) and its directory parse (an
object per entry) cost more than reading a 3,000-tensor ``data.pkl``. ``torch.save`` writes one shape of
archive: no archive comment, one disk, sizes and offsets that fit the classic directory fields (its zip64 end
records are read), every member it reads stored (not compressed), ASCII names, flags at most
"data descriptor" and "UTF-8 names". :func:`read_zip` reads such an archive's directory and the small members the
checkpoint reader needs (every top-level ``*.pkl``, the version and byte-order members), checking what zipfile
checks when it reads them (the local header's signature and name, the CRC-32). Anything else — another shape,
a damaged byte, a member over its size limit — returns None, and the caller reads the archive with zipfile as
before, so every refusal and its message stay zipfile's.
"""

from __future__ import annotations

import struct
from typing import IO

__all__ = ["Member", "SMALL_MEMBERS", "read_zip"]

SMALL_MEMBERS = ("byteorder", "version", ".format_version", ".storage_alignment")
_END = struct.Struct("<4s4H2LH")  # end of central directory record, as zipfile reads it
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
_LOCAL = struct.Struct("<4s2B4HL2L2H")
_LOCATOR = struct.Struct("<4sLQL")  # zip64 end of central directory locator
_END64 = struct.Struct("<4sQ2H2L4Q")  # zip64 end of central directory record
_FLAGS = 0x08 | 0x800  # data descriptor, UTF-8 names: what torch's writer sets; others (encryption...) go to zipfile
_MAX_VERSION = 63  # zipfile's MAX_EXTRACT_VERSION


class Member:
    """One directory entry: the fields of ``zipfile.ZipInfo`` the checkpoint reader uses."""

    __slots__ = ("filename", "flag_bits", "compress_type", "extract_version", "CRC", "compress_size", "file_size",
                 "header_offset")

    def __init__(self, filename: str, flag_bits: int, compress_type: int, extract_version: int, crc: int,
                 compress_size: int, file_size: int, header_offset: int) -> None:
        self.filename = filename
        self.flag_bits = flag_bits
        self.compress_type = compress_type
        self.extract_version = extract_version
        self.CRC = crc
        self.compress_size = compress_size
        self.file_size = file_size
        self.header_offset = header_offset


def _directory(fh: IO[bytes], size: int, max_directory: int) -> dict[str, Member] | None:
    if size < _END.size:
        return None
    fh.seek(size - _END.size)
    tail = fh.read(_END.size)
    if len(tail) != _END.size:
        return None
    sig, disk, disk_cd, on_disk, total, cd_size, cd_offset, comment = _END.unpack(tail)
    if sig != b"PK\x05\x06" or comment:
        return None  # an archive comment: zipfile searches for the end record
    end = size - _END.size
    if end >= _LOCATOR.size:  # zipfile reads a zip64 locator from the 20 bytes before the end record, if there
        fh.seek(end - _LOCATOR.size)
        lsig, diskno, reloff, disks = _LOCATOR.unpack(fh.read(_LOCATOR.size))
        if lsig == b"PK\x06\x07":  # torch's writer adds the zip64 records even to small archives
            end -= _LOCATOR.size + _END64.size
            if diskno != 0 or disks != 1 or reloff != end or end < 0:
                return None
            fh.seek(end)
            (sig64, _sz, _cv, _rv, disk, disk_cd, on_disk, total, cd_size,
             cd_offset) = _END64.unpack(fh.read(_END64.size))
            if sig64 != b"PK\x06\x06":
                return None
    if disk or disk_cd or on_disk != total or cd_offset + cd_size != end:
        return None  # several disks, or data before the archive: zipfile's business
    if cd_size > max_directory or total > max_directory // _CENTRAL.size:
        return None  # the reader's own refusal says how large
    fh.seek(cd_offset)
    data = fh.read(cd_size)
    if len(data) != cd_size:
        return None
    members: dict[str, Member] = {}
    lowered: set[str] = set()
    pos, unpack, fixed = 0, _CENTRAL.unpack_from, _CENTRAL.size
    while pos < cd_size:
        if pos + fixed > cd_size:
            return None
        (sig, _cv, _cs, version, _r, flags, method, _t, _d, crc, csize, fsize, n, extra, note, *_rest,
         offset) = unpack(data, pos)
        raw = data[pos + fixed:pos + fixed + n]
        if (sig != b"PK\x01\x02" or extra or note or flags & ~_FLAGS or method not in (0, 8) or version > _MAX_VERSION
                or len(raw) != n or not raw.isascii() or b"\x00" in raw):
            return None
        name = raw.decode("ascii")
        if name in members or name.lower() in lowered:  # torch's lookup ignores case: zipfile's path judges both
            return None
        lowered.add(name.lower())
        members[name] = Member(name, flags, method, version, crc, csize, fsize, offset)
        pos += fixed + n
    return members if len(members) == total else None


def _read(fh: IO[bytes], member: Member, size: int, limit: int) -> bytes | None:
    """A stored member's bytes, or None where zipfile would refuse it (or say more than None can)."""
    import zlib

    if member.file_size > limit or member.compress_type != 0 or member.compress_size != member.file_size:
        return None  # a compressed member is zipfile's to inflate (TorchScript deflates only its code/ files)
    fh.seek(member.header_offset)
    head = fh.read(_LOCAL.size)
    if len(head) != _LOCAL.size:
        return None
    sig, *_fields, n, extra = _LOCAL.unpack(head)
    if sig != b"PK\x03\x04" or fh.read(n) != member.filename.encode("ascii"):
        return None
    start = member.header_offset + _LOCAL.size + n + extra
    if start + member.compress_size > size:
        return None
    fh.seek(start)
    data = fh.read(member.compress_size)
    if len(data) != member.compress_size or zlib.crc32(data) != member.CRC:
        return None
    return data


def read_zip(fh: IO[bytes], size: int, max_directory: int, max_pickle: int, max_small: int
             ) -> tuple[dict[str, Member], dict[str, bytes]] | None:
    """(directory, the bytes of every top-level ``*.pkl`` and of the small members beside ``data.pkl``), or None
    when the archive is not exactly the shape ``torch.save`` writes (then read it with zipfile)."""
    members = _directory(fh, size, max_directory)
    if members is None:
        return None
    contents: dict[str, bytes] = {}
    first = next(iter(members), "")
    prefix = first[: first.index("/") + 1].lower() if "/" in first else None  # torch's folder: the first entry's
    for name, member in members.items():
        low = name.lower()  # torch finds members case-insensitively
        if low.endswith(".pkl") and name.count("/") == 1:
            limit = max_pickle
        elif prefix is not None and low.startswith(prefix) and low[len(prefix):] in SMALL_MEMBERS:
            limit = max_small
        else:
            continue
        data = _read(fh, member, size, limit)
        if data is None:
            return None
        contents[name] = data
    return members, contents
