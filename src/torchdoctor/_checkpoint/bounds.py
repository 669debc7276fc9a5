"""Limits that keep a checkpoint read bounded in memory, time and nesting, whatever the file says.

Every pickle is walked opcode by opcode (:func:`prescan`: no object is built) *before* the C
unpickler sees it. The walk refuses what would make the C unpickler allocate or loop out of proportion to the
file: a memo index far beyond the objects made so far (the C memo is an array sized to the largest index, so
a 12-byte pickle naming index 10**9 asks for 16 GB), more opcodes than a :class:`Budget` allows (shared by a
file and every storage blob embedded in it, so a blob referenced a million times through the memo is paid a
million times), marks nested deeper than any state dict needs, and many distinct numbers with one hash (a
dict keyed by them is built in quadratic time). Embedded ``torch.save`` streams may nest only
:data:`MAX_EMBEDDED` deep.

>>> import pickle
>>> prescan(pickle.dumps({"w": [1, 2.5]}), 0, Budget(), "ok.pkl") > 0
True
>>> prescan(b"\\x80\\x02Nr\\x00\\xca\\x9a;.", 0, Budget(), "bomb.pkl")
Traceback (most recent call last):
torchdoctor.CheckpointError: bomb.pkl: refused: pickle memo index 1000000000 at byte 3, but only 0 objects were memoized before it (torch.load(weights_only=True) refuses this file too)
"""

from __future__ import annotations

import io
import math
import struct
from typing import IO, Any

from torchdoctor._checkpoint.errors import CheckpointError

__all__ = [
    "BLOB_COST", "MAX_EMBEDDED", "MAX_MARKS", "MAX_OPS", "MAX_PICKLE_BYTES", "MAX_SMALL_MEMBER", "BoundedFile", "Budget",
    "HashGuard", "prescan",
]  # fmt: skip

MAX_OPS = 5_000_000  # ~30 opcodes per tensor: room for 160k tensors; at worst ~3 s and ~500 MB of built objects
MAX_PICKLE_BYTES = 256 * 1024 * 1024  # a data.pkl (or legacy header) larger than this describes no real model
MAX_MARKS = 1_000  # open MARKs at once; a state dict nests a few levels
BLOB_COST = 250  # opcodes charged per embedded blob (its own setup costs ~100 us): at most 20,000 blobs a file
MAX_EMBEDDED = 2  # torch.storage._load_from_bytes inside one: pickle.dumps(tensor) needs 1
MAX_SMALL_MEMBER = 64  # archive/byteorder, archive/version and friends hold a few bytes
MAX_SAME_HASH = 1_000  # distinct numbers sharing one hash; real files have none
_MEMO_SLACK = 1_024  # a pickler numbers memo entries 0, 1, 2, ...; allow a little disorder

_MEMO_OPS = frozenset(b"pqrghj\x94")  # PUT, BINPUT, LONG_BINPUT, GET, BINGET, LONG_BINGET, MEMOIZE
_NUMBER_OPS = frozenset(b"IL\x8a\x8bFG")
_EXT_OPS = frozenset(b"\x82\x83\x84")  # EXT1, EXT2, EXT4
_MARK = ord("(")
_POPS_MARK = frozenset(b"eultdoi1\x90\x91")  # APPENDS, SETITEMS, LIST, TUPLE, DICT, OBJ, INST, POP_MARK, ...


# Per opcode byte: None unknown, 0 no argument, n > 0 fixed size, -1 one line, -2 two lines, -11 / -14 / -18 a
# 1-, 4- or 8-byte little-endian length then that many bytes. Written out rather than read from ``pickletools`` at
# import (which costs more than scanning a small pickle); a test rebuilds it from ``pickletools.opcodes``.
_BY_KIND: dict[int, bytes] = {
    0: b"().012NQR]abdelostu}\x81\x85\x86\x87\x88\x89\x8f\x90\x91\x92\x93\x94\x97\x98",
    1: b"Khq\x80\x82", 2: b"M\x83", 4: b"Jjr\x84", 8: b"G\x95",
    -1: b"FILPSVgp", -2: b"ci", -11: b"CU\x8a\x8c", -14: b"BTX\x8b", -18: b"\x8d\x8e\x96",
}  # fmt: skip


def _arg_kinds() -> list[int | None]:
    kinds: list[int | None] = [None] * 256
    for kind, codes in _BY_KIND.items():
        for code in codes:
            kinds[code] = kind
    return kinds


_KINDS = _arg_kinds()
# Opcodes whose argument needs a look: memo indices that size the C memo (BINGET's one byte never can), numbers
# long enough to choose their hash, extension codes, the marks, STOP.
_CHECKED = _MEMO_OPS - {ord("h")} | {ord("G")} | _EXT_OPS | _POPS_MARK | {_MARK, ord(".")}
# Per opcode byte: its whole length when it needs no look (the common opcodes of a state dict), else 0.
_STEPS = bytes(1 + k if k is not None and k >= 0 and c not in _CHECKED else 0 for c, k in enumerate(_KINDS))
_LONG_BINPUT = ord("r")
# Per opcode byte, what the pre-scan does (one table look per opcode): > 0 skip that many bytes, nothing to look
# at; _PUT4 a LONG_BINPUT (memo index checked inline); _PUT1 a BINPUT (its index is one byte: counted only);
# _OPEN a MARK; _CLOSE an argument-less opcode that pops a mark; _TEXT4 a 4-byte length then that many bytes;
# _LOOK everything else (STOP, numbers, memo reads, lines, extension codes, unknown bytes).
_PUT4, _PUT1, _OPEN, _CLOSE, _TEXT4, _LOOK = -1, -2, -3, -4, -5, 0


def _action(code: int) -> int:
    if _STEPS[code]:
        return _STEPS[code]
    if code == _LONG_BINPUT:
        return _PUT4
    if code == ord("q"):
        return _PUT1
    if code == _MARK:
        return _OPEN
    if code in _POPS_MARK and _KINDS[code] == 0:
        return _CLOSE
    if _KINDS[code] == -14 and code not in _NUMBER_OPS:
        return _TEXT4
    return _LOOK


_ACTIONS = tuple(_action(c) for c in range(256))
_U32 = struct.Struct("<I").unpack_from


class HashGuard:
    """Counts distinct numbers per hash value; refuses a collision flood (quadratic dict/set building)."""

    __slots__ = ("_buckets",)

    def __init__(self) -> None:
        self._buckets: dict[int, set[Any]] = {}

    def add(self, value: Any) -> bool:
        """True while the value is harmless; numbers whose hash an attacker can choose are counted."""
        if isinstance(value, bool):
            return True
        if isinstance(value, int):
            if -(1 << 61) < value < (1 << 61) - 1:  # small ints hash to themselves: no two collide
                return True
        elif isinstance(value, float):
            if not math.isfinite(value) or abs(value) < 2.0**53 and (value == 0 or abs(value) > 2.0**-60):
                return True
        elif not isinstance(value, complex):
            return True
        bucket = self._buckets.setdefault(hash(value), set())
        bucket.add(value)
        return len(bucket) <= MAX_SAME_HASH


class Budget:
    """What one file may still spend: opcodes (its own and those of every embedded blob) and nesting.

    ``blobs`` maps id(blob bytes) to (bytes, what they held); ``ext`` is set when a copyreg extension code was seen
    (the pickle needs the unpickler that resolves them). A plain class: see ``stubs.StorageRef``."""

    __slots__ = ("ops", "depth", "label", "blobs", "hashes", "ext")

    def __init__(self, ops: int = MAX_OPS, depth: int = 0, label: str = "", blobs: dict[int, tuple[Any, Any]] | None = None,
                 hashes: HashGuard | None = None, ext: bool = False) -> None:
        self.ops = ops
        self.depth = depth
        self.label = label
        self.blobs: dict[int, tuple[Any, Any]] = {} if blobs is None else blobs
        self.hashes = HashGuard() if hashes is None else hashes
        self.ext = ext

    def copy(self) -> Budget:
        """A shallow copy (the blob cache and the hash guard are shared), to try a read and keep it or not."""
        return Budget(self.ops, self.depth, self.label, self.blobs, self.hashes, self.ext)

    def __repr__(self) -> str:
        return f"Budget(ops={self.ops}, depth={self.depth}, label={self.label!r}, ext={self.ext})"


def _refuse(label: str, what: str) -> CheckpointError:
    return CheckpointError(f"{label}: refused: {what} (torch.load(weights_only=True) refuses this file too)")


def prescan(data: bytes, start: int, budget: Budget, label: str) -> int:
    """Walk one pickle of ``data`` from ``start`` without building anything; return where it ends.

    Only the arguments that bound the unpickler are decoded (memo indices, numbers); the rest are skipped by
    their lengths, about four times faster than ``pickletools.genops``. Raises :class:`CheckpointError` for a
    pickle that ends early, holds an unknown opcode, or goes over a limit.
    """
    kinds, actions, find, n, u32 = _KINDS, _ACTIONS, data.find, len(data), _U32
    pos, ops, puts, marks, limit = start, 0, 0, 0, budget.ops
    hashes = budget.hashes
    try:
        while True:
            act = actions[data[pos]]  # past the end: IndexError, a truncated pickle
            ops += 1
            if act > 0:  # most opcodes of a state dict: nothing to look at
                pos += act
                continue
            at = pos
            pos += 1
            if act == _PUT4:  # the commonest checked opcode of a large state dict
                end = pos + 4
                if end > n:
                    raise CheckpointError(f"{label}: truncated pickle (an argument at byte {at} runs past the end)")
                index = u32(data, pos)[0]
                if index > puts + _MEMO_SLACK:
                    raise _refuse(label, f"pickle memo index {index} at byte {at}, but only {puts} objects "
                                         "were memoized before it")
                puts += 1
                pos = end
                continue
            if act != _LOOK and ops > limit:
                raise CheckpointError(
                    f"{label}: refused: more than {MAX_OPS:,} pickle opcodes in this file and the storages embedded "
                    "in it (a pickle that repeats work through its memo)"
                )
            if act == _OPEN:
                marks += 1
                if marks > MAX_MARKS:
                    raise _refuse(label, f"pickle nests more than {MAX_MARKS} marks")
                continue
            if act == _CLOSE:
                marks -= 1
                continue
            if act == _TEXT4:  # BINUNICODE and friends: a 4-byte length, then the text
                if pos + 4 > n:
                    raise CheckpointError(f"{label}: truncated pickle (an argument at byte {at} runs past the end)")
                end = pos + 4 + u32(data, pos)[0]
                if end > n:
                    raise CheckpointError(f"{label}: truncated pickle (an argument at byte {at} runs past the end)")
                pos = end
                continue
            if act == _PUT1:  # a one-byte index is always below the slack: counted, never refused
                if pos + 1 > n:
                    raise CheckpointError(f"{label}: truncated pickle (an argument at byte {at} runs past the end)")
                puts += 1
                pos += 1
                continue
            code = data[at]
            kind = kinds[code]
            if kind is None:
                raise CheckpointError(f"{label}: corrupted pickle (unknown opcode {bytes([code])!r} at byte {at})")
            if ops > limit:
                raise CheckpointError(
                    f"{label}: refused: more than {MAX_OPS:,} pickle opcodes in this file and the storages embedded "
                    "in it (a pickle that repeats work through its memo)"
                )
            if kind == 0:
                if code == 46:  # STOP
                    budget.ops -= ops
                    return pos
                if code == _MARK:
                    marks += 1
                    if marks > MAX_MARKS:
                        raise _refuse(label, f"pickle nests more than {MAX_MARKS} marks")
                elif code in _POPS_MARK:
                    marks -= 1
                elif code == 0x94:  # MEMOIZE
                    puts += 1
                continue
            if kind > 0:
                end = pos + kind
            elif kind == -11 and pos < n:
                end = pos + 1 + data[pos]
            elif kind == -14:  # BINUNICODE and friends: a 4-byte length (a short slice past the end stays short)
                end = pos + 4 + int.from_bytes(data[pos:pos + 4], "little")
            else:
                end = _arg_end(data, pos, kind, find)
            if end > n:
                raise CheckpointError(f"{label}: truncated pickle (an argument at byte {at} runs past the end)")
            if code in _MEMO_OPS:
                index = (data[pos] if kind == 1 else int(data[pos:end]) if kind == -1
                         else int.from_bytes(data[pos:end], "little"))
                if index > puts + _MEMO_SLACK:
                    if code in b"pqr":
                        raise _refuse(label, f"pickle memo index {index} at byte {at}, but only {puts} objects "
                                             "were memoized before it")
                    raise CheckpointError(f"{label}: corrupted pickle (memo index {index} at byte {at} was never set)")
                puts += code in b"pqr"
            elif code in _NUMBER_OPS and end - pos >= 8 and not hashes.add(_number(code, data[pos:end])):
                raise _refuse(label, f"more than {MAX_SAME_HASH} distinct numbers share one hash value "
                                     "(building a dict of them takes quadratic time)")
            elif code in _EXT_OPS:
                budget.ext = True
            pos = end
    except CheckpointError:
        raise
    except IndexError:  # an opcode read at or past the end of the data
        raise CheckpointError(f"{label}: truncated pickle (it ends at byte {n} before its STOP opcode)") from None
    except (ValueError, OverflowError, struct.error) as exc:  # an argument that does not parse
        raise CheckpointError(f"{label}: corrupted pickle ({str(exc)[:120]})") from None


def _arg_end(data: bytes, pos: int, kind: int, find: Any) -> int:
    if kind > 0:
        return pos + kind
    if kind == -1 or kind == -2:
        end = find(b"\n", pos)
        if kind == -2 and end >= 0:
            end = find(b"\n", end + 1)
        return len(data) + 1 if end < 0 else end + 1
    width = -kind - 10
    return pos + width + int.from_bytes(data[pos:pos + width], "little")


def _number(code: int, raw: bytes) -> int | float:
    """The value of a number opcode's argument (only ones long enough to reach a chosen hash)."""
    if code == 0x8A or code == 0x8B:  # LONG1 / LONG4: length prefix, then signed little-endian bytes
        width = 1 if code == 0x8A else 4
        return int.from_bytes(raw[width:], "little", signed=True)
    if code == ord("G"):
        return float(struct.unpack(">d", raw)[0])
    text = raw.strip().rstrip(b"L")
    return float(text) if code == ord("F") else int(text)


class BoundedFile(io.RawIOBase):
    """A read-only view of a binary file that never asks the OS for more than what remains.

    ``read(n)`` of a buffered file allocates ``n`` bytes before reading; a zip directory declaring a 4 GiB
    central directory in a 1 KiB file would otherwise allocate 4 GiB.
    """

    def __init__(self, fh: IO[bytes], size: int) -> None:
        super().__init__()
        self._fh = fh
        self._size = size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._fh.seek(offset, whence)

    def tell(self) -> int:
        return self._fh.tell()

    def read(self, n: int | None = -1) -> bytes:
        left = max(self._size - self._fh.tell(), 0)
        return self._fh.read(left if n is None or n < 0 else min(n, left))

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
