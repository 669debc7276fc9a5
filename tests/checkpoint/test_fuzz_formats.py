"""An in-process mutation fuzzer over every format the checkpoint reader accepts, on a fixed budget.

Seeds: torch.save zip and legacy streams, plain pickles of protocols 0, 1, 2 and 4 (dotted names, copyreg
extension codes, a name computed at load time), safetensors, a distributed checkpoint's ``.metadata``, a GGUF
header and a torch < 0.4 tar header. Each mutant is read by ``check_checkpoint`` (the command line's reader):
it must answer with a report or one :class:`CheckpointError` line, never another exception, and never run the
seeds' payloads. The mutants are deterministic (fixed seed) and bounded by count and by seconds, so the suite
stays fast. A crash fails the test with the mutant's bytes: keep them as a test of their own beside the
hostile files (``hostile.py``). A long run (seeds 0-1500, 19,500 mutants, 2026-11-26) found no crash.
"""

from __future__ import annotations

import io
import pickle
import random
import struct
import tarfile
import time
from pathlib import Path

import pytest
import torch

from torchdoctor._checkpoint.scan import CheckpointError, check_checkpoint

from . import corpus
from .test_fuzz import _mutate

BUDGET_SECONDS = 6.0
MAX_MUTANTS = 600


def _seeds(canary: Path) -> dict[str, bytes]:
    from safetensors.torch import save as st_save

    marker = str(canary / "pwned")
    sd = {"w": torch.randn(3, 2), "h": torch.zeros(2, dtype=torch.float16)}
    zbuf, lbuf = io.BytesIO(), io.BytesIO()
    torch.save(sd, zbuf)
    torch.save(sd, lbuf, _use_new_zipfile_serialization=False)
    tbuf = io.BytesIO()
    with tarfile.open(fileobj=tbuf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        info = tarfile.TarInfo("pickle")
        payload = pickle.dumps(sd["w"].tolist())
        info.size = len(payload)
        tf.addfile(info, io.BytesIO(payload))
    gguf = b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + struct.pack("<Q", 4) + b"name" + struct.pack("<I", 8) + \
        struct.pack("<Q", 1) + b"m"
    return {
        "zip.pt": zbuf.getvalue(),
        "legacy.pt": lbuf.getvalue(),
        "legacy-keys-payload.pt": corpus.legacy(4, corpus.dotted("os", "system", marker)),
        "proto0.pkl": corpus.proto0(marker),
        "proto1.pkl": corpus.proto1(marker),
        "proto4-dotted.pkl": corpus.dotted("torch", "os.system", marker),
        "ext2.pkl": corpus.ext_code(marker, 2),
        "computed.pkl": corpus.computed_name(marker),
        "tensor.pt": corpus.tensor_zip([2, 2], [2, 1], numel=4),
        "model.safetensors": st_save(sd, metadata={"format": "pt"}),
        "tar.pt": tbuf.getvalue(),
        "header.gguf": gguf,
    }


def _dcp_seed(root: Path) -> Path:
    from torch.distributed.checkpoint import save as dcp_save

    d = root / "dcp"
    dcp_save({"w": torch.zeros(2, 3), "n": 3}, checkpoint_id=str(d))
    return d


def _check(path: Path) -> str:
    """'ok', 'problems' or 'refused'; anything else is a crash (raised)."""
    try:
        report = check_checkpoint(path)
    except CheckpointError as exc:
        text = str(exc)
        assert "\n" not in text and len(text) < 1000, text[:300]
        return "refused"
    return "ok" if report.ok else "problems"


def test_fuzz_every_format_in_process(tmp_path):
    canary = tmp_path / "canary"
    canary.mkdir()
    seeds = _seeds(canary)
    dcp = _dcp_seed(tmp_path)
    meta = (dcp / ".metadata").read_bytes()
    rng = random.Random(20261126)
    verdicts: dict[str, int] = {}
    start = time.monotonic()
    done = 0
    names = sorted(seeds) + ["dcp/.metadata"]
    while done < MAX_MUTANTS and time.monotonic() - start < BUDGET_SECONDS:
        name = names[done % len(names)]
        if name == "dcp/.metadata":
            (dcp / ".metadata").write_bytes(_mutate(meta, rng))
            path = dcp
        else:
            path = tmp_path / f"mutant-{name}"
            path.write_bytes(_mutate(seeds[name], rng))
        try:
            verdict = _check(path)
        except AssertionError:
            raise
        except Exception as exc:  # a crash: the failure carries the input to keep as a test
            data = (dcp / ".metadata").read_bytes() if name == "dcp/.metadata" else path.read_bytes()
            pytest.fail(f"{name} mutant crashed the reader ({type(exc).__name__}: {exc}); input: {data!r}"[:3000])
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
        done += 1
    assert not any(canary.iterdir())
    assert done >= 60, done  # the budget reaches every seed several times
    assert verdicts.get("refused", 0) and verdicts.get("ok", 0) + verdicts.get("problems", 0), verdicts


def test_gguf_and_tar_are_named(tmp_path):
    seeds = _seeds(tmp_path)
    (tmp_path / "x.gguf").write_bytes(seeds["header.gguf"])
    with pytest.raises(CheckpointError, match="GGUF file, not a PyTorch checkpoint"):
        check_checkpoint(tmp_path / "x.gguf")
    (tmp_path / "old.pt").write_bytes(seeds["tar.pt"])
    with pytest.raises(CheckpointError, match="tar-format checkpoint from torch < 0.4"):
        check_checkpoint(tmp_path / "old.pt")
