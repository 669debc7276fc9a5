"""Tensor records are validated as torch validates them (same verdict as ``torch.load(weights_only=True)`` on
hostile files of our own), sizes are bounded everywhere, and no line of text carries a long name from the file."""

from __future__ import annotations

import io
import json
import struct

import pytest
import torch

from torchdoctor._checkpoint.scan import CheckpointError, check_checkpoint
from torchdoctor._checkpoint.render import render_checkpoint

from . import corpus

CASES = {**corpus.HOSTILE, **corpus.VALID_TENSORS}


def _torch_loads(data: bytes) -> bool:
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception:
        return False
    return True


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_verdict_as_torch_weights_only(tmp_path, name):
    data = CASES[name]()
    path = tmp_path / name
    path.write_bytes(data)
    try:
        report = check_checkpoint(path)
        ours = True
    except CheckpointError as exc:
        text = str(exc)
        assert "\n" not in text and len(text) < 600, text
        ours = False
    assert ours == _torch_loads(data), name
    if ours:
        assert report.ok and report.tensors[0].path == "w"
    else:
        assert "refused" in text and "torch.load refuses it" in text


def _st(header: dict, data: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def test_long_names_and_shapes_never_make_long_lines(tmp_path):
    big = tmp_path / "bigname.safetensors"
    big.write_bytes(_st({"n" * 2_000_000 + "\x1b[2K": {"dtype": "F16", "shape": [1], "data_offsets": [0, 3]}},
                        bytes(3)))
    with pytest.raises(CheckpointError) as err:
        check_checkpoint(big)
    assert len(str(err.value)) < 400 and "(2,000,004 characters)" in str(err.value)
    shape = tmp_path / "bigshape.safetensors"
    shape.write_bytes(_st({"w": {"dtype": "F32", "shape": [2**64 - 1] * 60_000, "data_offsets": [0, 4]}}, bytes(4)))
    with pytest.raises(CheckpointError, match=r"too large to address") as err:
        check_checkpoint(shape)
    assert len(str(err.value)) < 400 and "60,000 dims" in str(err.value)
    # a dtype problem naming a 100,000-character key, and a pickle global of that length
    key = "k" * 100_000
    torch.save({key: torch.zeros(2, dtype=torch.float16)}, tmp_path / "k.pt")
    report = check_checkpoint(tmp_path / "k.pt", dtype=__import__("torchdoctor._checkpoint.dtypes",
                                                                  fromlist=["x"]).FLOAT32)
    assert [p.kind for p in report.problems] == ["dtype"]
    assert max(len(line) for line in render_checkpoint(report).splitlines()) < 600
    (tmp_path / "g.pkl").write_bytes(corpus.dotted("os", "system" + "x" * 100_000, "M"))
    report = check_checkpoint(tmp_path / "g.pkl")
    assert report.problems[0].kind == "unsafe_global"
    assert max(len(line) for line in render_checkpoint(report).splitlines()) < 600


def test_git_lfs_pointer_is_named(tmp_path):
    pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"a" * 64 + b"\nsize 2336927755\n"
    for name in ("model.safetensors", "pytorch_model.bin", "x.ckpt"):
        (tmp_path / name).write_bytes(pointer)
        with pytest.raises(CheckpointError, match=r"a git-LFS pointer, not the checkpoint itself: run `git lfs pull`"):
            check_checkpoint(tmp_path / name)


def test_dcp_metadata_sizes_are_bounded(tmp_path):
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint import save as dcp_save

    d = tmp_path / "dcp"
    dcp_save({"w": torch.zeros(2, 3)}, checkpoint_id=str(d))
    meta = FileSystemReader(str(d)).read_metadata()
    meta.state_dict_metadata["w"].size = torch.Size([2**62] * 20)
    (d / ".metadata").write_bytes(__import__("pickle").dumps(meta))
    with pytest.raises(CheckpointError, match=r"refused: .metadata entry 'w': tensor of sizes \[4611686018427387904"):
        check_checkpoint(d)


def test_one_huge_key_over_many_children_stays_small(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "bigkey.pkl"
    path.write_bytes(__import__("pickle").dumps({"k" * (8 << 20): list(range(1_000_000))}, protocol=4))
    code = ("import resource, sys; from torchdoctor._checkpoint.scan import check_checkpoint; "
            f"r = check_checkpoint({str(path)!r}); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) < 900_000  # kB (it took 3.4 GB when every child copied the key)
