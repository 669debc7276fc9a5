"""The zip reader without zipfile (``_checkpoint/zipfast.py``) against zipfile itself: on every archive it accepts,
the same directory and the same member bytes; anything else (damaged bytes, other shapes) goes back to zipfile."""

from __future__ import annotations

import io
import os
import random
import zipfile
from pathlib import Path

import pytest
import torch

from torchdoctor._checkpoint.bounds import MAX_PICKLE_BYTES, MAX_SMALL_MEMBER
from torchdoctor._checkpoint.scan import check_checkpoint
from torchdoctor._checkpoint.zipcheck import MAX_ZIP_DIRECTORY
from torchdoctor._checkpoint.zipfast import read_zip

_FIELDS = ("flag_bits", "compress_type", "extract_version", "CRC", "compress_size", "file_size", "header_offset")


def _archives(tmp: Path) -> list[bytes]:
    out = []
    for i, obj in enumerate([{"w": torch.zeros(3)}, {f"l{i}.w": torch.ones(2, 2) for i in range(40)},
                             torch.nn.Linear(3, 2).state_dict(), {"opt": {"step": torch.tensor(1.0)}, "n": 3}]):
        path = tmp / f"a{i}.pt"
        torch.save(obj, path)
        out.append(path.read_bytes())
    scripted = tmp / "script.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(scripted))  # TorchScript: constants.pkl, code/
    out.append(scripted.read_bytes())
    return out


def _same_as_zipfile(raw: bytes) -> bool:
    """True when the fast reader took the archive (and then agrees with zipfile), False when it handed it back."""
    got = read_zip(io.BytesIO(raw), len(raw), MAX_ZIP_DIRECTORY, MAX_PICKLE_BYTES, MAX_SMALL_MEMBER)
    if got is None:
        return False
    members, contents = got
    zf = zipfile.ZipFile(io.BytesIO(raw))  # must read it: the fast reader never accepts what zipfile refuses
    infos = {i.filename: i for i in zf.infolist()}
    assert list(members) == list(infos)
    for name, m in members.items():
        assert [getattr(m, f) for f in _FIELDS] == [getattr(infos[name], f) for f in _FIELDS], name
    for name, data in contents.items():
        assert zf.read(name) == data, name  # zipfile checks the local header and the CRC-32 as it reads
    return True


def test_torch_save_archives_are_read_without_zipfile_and_agree(tmp_path: Path) -> None:
    archives = _archives(tmp_path)
    assert all(_same_as_zipfile(raw) for raw in archives)
    got = read_zip(io.BytesIO(archives[-1]), len(archives[-1]), MAX_ZIP_DIRECTORY, MAX_PICKLE_BYTES,
                   MAX_SMALL_MEMBER)
    assert got is not None and any(n.endswith("constants.pkl") for n in got[1])  # every pickle, not data.pkl only


def test_damaged_archives_go_back_to_zipfile_or_agree_with_it(tmp_path: Path) -> None:
    rng = random.Random(30)
    taken = handed_back = 0
    for raw in _archives(tmp_path):
        for _ in range(300):
            mutant = bytearray(raw)
            where = rng.choice(["anywhere", "tail", "head"])
            for _ in range(rng.randint(1, 3)):
                span = {"anywhere": len(raw), "tail": min(len(raw), 400), "head": min(len(raw), 200)}[where]
                i = rng.randrange(span) if where != "tail" else len(raw) - 1 - rng.randrange(span)
                mutant[i] = rng.randrange(256)
            try:
                ok = _same_as_zipfile(bytes(mutant))
            except zipfile.BadZipFile:
                raise AssertionError("the fast reader accepted an archive zipfile refuses") from None
            taken += ok
            handed_back += not ok
    assert taken > 50 and handed_back > 50  # both ways were exercised


@pytest.mark.parametrize("shape", ["comment", "deflated", "non-ascii name"])
def test_other_shapes_go_to_zipfile(tmp_path: Path, shape: str) -> None:
    """An archive torch.save does not write is read by zipfile, as before (and still scanned)."""
    src = tmp_path / "src.pt"
    torch.save({"w": torch.zeros(4)}, src)
    out = tmp_path / "other.pt"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            method = zipfile.ZIP_DEFLATED if shape == "deflated" else zipfile.ZIP_STORED
            zout.writestr(info.filename, zin.read(info), compress_type=method)
        if shape == "non-ascii name":
            zout.writestr("src/extras/é.txt", b"x")
        if shape == "comment":
            zout.comment = b"made by hand"
    raw = out.read_bytes()
    assert read_zip(io.BytesIO(raw), len(raw), MAX_ZIP_DIRECTORY, MAX_PICKLE_BYTES, MAX_SMALL_MEMBER) is None
    report = check_checkpoint(str(out))
    assert [(r.path, r.dtype.name, r.shape) for r in report.tensors] == [("w", "float32", (4,))]


def test_a_member_over_its_limit_is_refused_by_the_usual_check(tmp_path: Path) -> None:
    path = tmp_path / "m.pt"
    torch.save({"w": torch.zeros(4)}, path)
    raw = path.read_bytes()
    assert read_zip(io.BytesIO(raw), len(raw), MAX_ZIP_DIRECTORY, 10, MAX_SMALL_MEMBER) is None
    assert os.path.getsize(path) == len(raw)
