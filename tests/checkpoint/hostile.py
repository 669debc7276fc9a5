"""Hostile checkpoint files, built at test time (also used by bench/checkpoint.py).

Each builder returns the bytes of a file (or writes it) exactly as an attacker or a damaged disk would make it;
none needs anything but torch, pickle and struct.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import zipfile
import zlib
from pathlib import Path

import torch

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def memo_bomb(opcode: str = "LONG_BINPUT") -> bytes:
    """12 bytes: memoize None at index 10**9 (the C unpickler sizes its memo array to the index)."""
    index = 10**9
    put = b"r" + index.to_bytes(4, "little") if opcode == "LONG_BINPUT" else b"p%d\n" % index
    return b"\x80\x02N" + put + b"0N\x85."


def _legacy_stream(main: bytes, keys: bytes = b"\x80\x02]q\x00.") -> bytes:
    head = [LEGACY_MAGIC, 1001, {"protocol_version": 1001, "little_endian": True,
                                 "type_sizes": {"short": 2, "int": 4, "long": 4}}]
    return b"".join(pickle.dumps(x, protocol=2) for x in head) + main + keys


def _calls(blob: bytes, fanout: int) -> bytes:
    """A pickle: a list of ``fanout`` calls of torch.storage._load_from_bytes(blob), the blob memoized once."""
    data = b"B" + struct.pack("<I", len(blob)) + blob  # BINBYTES
    return (b"\x80\x03ctorch.storage\n_load_from_bytes\nq\x00" + data + b"q\x01("
            + b"h\x00h\x01\x85R" * fanout + b"l.")


def nested_bomb(depth: int = 6, fanout: int = 8) -> bytes:
    """A plain pickle whose storage blobs embed blobs: ``fanout ** depth`` parses from about a kilobyte."""
    blob = _legacy_stream(b"\x80\x02]q\x00.")
    for _ in range(depth - 1):
        blob = _legacy_stream(_calls(blob, fanout))
    return _calls(blob, fanout)


def wide_blob_bomb(fanout: int = 200_000) -> bytes:
    """One level deep but a tiny blob called ``fanout`` times through the memo (1.2 MB, 200k parses)."""
    return _calls(_legacy_stream(b"\x80\x02]q\x00."), fanout)


def torch_zip(state: object) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def torch_legacy(state: object) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf, _use_new_zipfile_serialization=False)
    return buf.getvalue()


def _crc_of_zeros(n: int) -> int:
    crc, chunk = 0, bytes(64 * 1024 * 1024)
    while n:
        k = min(n, len(chunk))
        crc = zlib.crc32(chunk[:k] if k < len(chunk) else chunk, crc)
        n -= k
    return crc


def zip_declaring(path: Path, member: str = "byteorder", size: int = 3 * 1024**3) -> Path:
    """A torch.save zip plus a stored ``archive/<member>`` of ``size`` zero bytes, written as a sparse hole."""
    good = zipfile.ZipFile(io.BytesIO(torch_zip({"w": torch.zeros(2)})))
    prefix = good.namelist()[0].split("/")[0] + "/"
    with open(path, "wb") as f, zipfile.ZipFile(f, "w") as z:
        for info in good.infolist():
            if info.filename != prefix + member:
                z.writestr(info.filename, good.read(info))
    raw = bytearray(Path(path).read_bytes())
    eocd = raw.rindex(b"PK\x05\x06")
    n_entries, cd_size, cd_offset = struct.unpack("<HII", raw[eocd + 10: eocd + 20])
    central = bytes(raw[cd_offset: cd_offset + cd_size])
    name = (prefix + member).encode()
    crc = _crc_of_zeros(size)
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0x21, crc, size, size, len(name), 0) + name
    new_local_at = cd_offset
    data_end = new_local_at + len(local) + size
    entry = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 0, 0, 0x21, crc, size, size, len(name),
                        0, 0, 0, 0, 0, new_local_at) + name
    new_central = central + entry
    eocd_rec = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n_entries + 1, n_entries + 1, len(new_central),
                           data_end, 0)
    with open(path, "r+b") as f:
        f.truncate(cd_offset)
        f.seek(cd_offset)
        f.write(local)
        f.seek(data_end)  # the member's bytes are a hole: zeros that take no disk
        f.write(new_central + eocd_rec)
    return path


def zip_patched(state: object, field: str, value: int) -> bytes:
    """A torch.save zip whose data.pkl header says: encrypted ('flags'), method ``value`` ('method') or
    needs zip version ``value`` ('version'); patched in both the local and the central header."""
    raw = bytearray(torch_zip(state))
    z = zipfile.ZipFile(io.BytesIO(bytes(raw)))
    info = next(i for i in z.infolist() if i.filename.endswith("/data.pkl"))
    local = info.header_offset
    central = raw.index(b"PK\x01\x02" + bytes(2), 0)  # first central entry
    while not raw[central + 46: central + 46 + len(info.filename)] == info.filename.encode():
        central = raw.index(b"PK\x01\x02", central + 4)
    local_field = {"version": 4, "flags": 6, "method": 8}[field]
    central_field = local_field + 2
    struct.pack_into("<H", raw, local + local_field, value)
    struct.pack_into("<H", raw, central + central_field, value)
    return bytes(raw)


def zip_directory_claiming(size: int = 1 << 30) -> bytes:
    """A torch.save zip (rewritten without zip64 records) whose end record claims a ``size``-byte directory."""
    z = zipfile.ZipFile(io.BytesIO(torch_zip({"w": torch.zeros(2)})))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as w:
        for info in z.infolist():
            w.writestr(info.filename, z.read(info))
    raw = bytearray(out.getvalue())
    struct.pack_into("<I", raw, raw.rindex(b"PK\x05\x06") + 12, size)
    return bytes(raw)


def legacy_missing_key() -> bytes:
    """A legacy torch.save file whose storage-key list omits one of the two storages its pickle uses."""
    raw = torch_legacy({"a": torch.ones(2), "b": torch.zeros(3)})
    import pickletools

    f = io.BytesIO(raw)
    starts = [0]
    for _ in range(5):
        for _op in pickletools.genops(f):
            pass
        starts.append(f.tell())
    keys = pickle.loads(raw[starts[4]: starts[5]])
    assert len(keys) == 2
    return raw[: starts[4]] + pickle.dumps(keys[:1], protocol=2) + raw[starts[5]:]


def safetensors_bytes(header: object = None, data: bytes = b"", raw: bytes | None = None) -> bytes:
    h = raw if raw is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def _t(dtype: str, shape: object, offsets: object) -> dict[str, object]:
    return {"dtype": dtype, "shape": shape, "data_offsets": offsets}


def safetensors_refused() -> dict[str, bytes]:
    """Headers the safetensors library refuses (name -> file bytes); each is checked against safe_open."""
    eight = bytes(8)
    cases = {
        "overlapping-offsets": safetensors_bytes({"a": _t("F32", [2], [0, 8]), "b": _t("F32", [2], [0, 8])}, eight),
        "gapped-offsets": safetensors_bytes({"a": _t("F32", [2], [0, 8]), "b": _t("F32", [2], [12, 20])}, bytes(20)),
        "gap-at-start": safetensors_bytes({"a": _t("F32", [2], [4, 12])}, bytes(12)),
        "negative-dim": safetensors_bytes({"a": _t("F32", [-2], [0, 8])}, eight),
        "string-shape": safetensors_bytes({"a": _t("F32", "2", [0, 8])}, eight),
        "string-dim": safetensors_bytes({"a": _t("F32", ["2"], [0, 8])}, eight),
        "float-offsets": safetensors_bytes({"a": _t("F32", [2], [0.0, 8.0])}, eight),
        "unknown-dtype": safetensors_bytes({"a": _t("F99", [2], [0, 8])}, eight),
        "metadata-list": safetensors_bytes({"__metadata__": ["x"], "a": _t("F32", [2], [0, 8])}, eight),
        "metadata-int-value": safetensors_bytes({"__metadata__": {"x": 1}, "a": _t("F32", [2], [0, 8])}, eight),
        "shape-1e400": safetensors_bytes(raw=b'{"a":{"dtype":"F32","shape":[1e400],"data_offsets":[0,8]}}', data=eight),
        "offsets-1e400": safetensors_bytes(raw=b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,1e400]}}', data=eight),
        "negative-zero-offset": safetensors_bytes(raw=b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[-0,8]}}',
                                                  data=eight),
        "trailing-bytes": safetensors_bytes({"a": _t("F32", [2], [0, 8])}, bytes(9)),
        "three-offsets": safetensors_bytes({"a": _t("F32", [2], [0, 8, 9])}, eight),
        "bool-dim": safetensors_bytes({"a": _t("F32", [True, 2], [0, 8])}, eight),
        "nan-literal": safetensors_bytes(raw=b'{"__metadata__":{"x":NaN},"a":{"dtype":"F32","shape":[2],'
                                             b'"data_offsets":[0,8]}}', data=eight),
        "lone-surrogate": safetensors_bytes(raw=b'{"a\\ud800":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
                                            data=eight),
        "deep-json": safetensors_bytes(raw=b'{"x":' + b"[" * 200 + b"]" * 200 + b"}"),
        "overflowing-shape": safetensors_bytes({"a": _t("U8", [2**40, 2**40], [0, 8])}, eight),
        "subbyte-misaligned": safetensors_bytes({"a": _t("F4", [3], [0, 2])}, bytes(2)),
        "missing-dtype": safetensors_bytes({"a": {"shape": [2], "data_offsets": [0, 8]}}, eight),
    }
    return cases


def big_header_safetensors(path: Path, n: int = 100_000_001) -> Path:
    """A valid JSON header padded with spaces to ``n`` bytes: over safetensors' 100,000,000, under 100 MiB."""
    body = json.dumps({"a": _t("F32", [2], [0, 8])}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n) + body)
        f.write(b" " * (n - len(body)))
        f.write(bytes(8))
    return path


class Evil:
    """A pickle that runs ``touch MARKER`` when loaded by anything but torchdoctor."""

    def __init__(self, marker: os.PathLike[str] | str) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))
