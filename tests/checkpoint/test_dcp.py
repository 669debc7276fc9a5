"""Distributed checkpoints (``torch.distributed.checkpoint``): saved here, scanned by file API and by CLI.

torch's own ``FileSystemReader(dir).read_metadata()`` calls plain ``pickle.load`` on ``.metadata``; it is used
below only on the files this test wrote, as the reference the scan must agree with. The scan itself reads
``.metadata`` through the restricted unpickler: a payload planted in it is named, never run.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import torchdoctor
from checkpoint import hostile
from checkpoint.capped import SRC, assert_bounded, run_scans


def _dcp_save(state: dict, path: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ... assuming a single process"
        dcp.save(state, checkpoint_id=str(path))
    return path


def _reference(path: Path) -> dict[str, tuple[torch.dtype, tuple[int, ...], int]]:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = FileSystemReader(str(path)).read_metadata()  # trusted: this test wrote the file
    return {k: (m.properties.dtype, tuple(m.size), len(m.chunks)) for k, m in meta.state_dict_metadata.items()
            if isinstance(m, TensorStorageMetadata)}


@pytest.fixture(scope="module")
def dcp_dir(tmp_path_factory) -> Path:
    state = {"model": {"w": torch.randn(3, 4), "h": torch.zeros(5, dtype=torch.float16)},
             "emb": torch.ones(7, 2, dtype=torch.bfloat16), "step": 11}
    path = _dcp_save(state, tmp_path_factory.mktemp("dcp") / "ckpt")
    assert sorted(os.listdir(path)) == [".metadata", "__0_0.distcp"]
    return path


def test_dcp_by_file_api(dcp_dir):
    report = torchdoctor.scan(str(dcp_dir))
    assert report.ok, report.problems
    ref = _reference(dcp_dir)
    got = {t.path: (t.dtype, t.shape) for t in report.tensors}
    assert got == {k: (dt, shape) for k, (dt, shape, _) in ref.items()}
    assert set(got) == {"model.w", "model.h", "emb"}
    (doc,) = report.extra["files"]
    assert doc["format"] == "torch-dcp" and "sharding" not in doc  # one chunk each: not sharded
    assert any("1 non-tensor value(s): step" in n for n in doc["notes"])
    bad = torchdoctor.scan(str(dcp_dir), dtype="float32")
    assert {p.found for p in bad.problems} == {"float16", "bfloat16"}


def test_dcp_by_cli(dcp_dir):
    text, as_json = run_scans([["scan", str(dcp_dir)], ["scan", str(dcp_dir), "--json", "--dtype", "bfloat16"]])
    assert_bounded(text)
    assert text.rc == 0 and "ok: no problems found" in text.out and "3 tensors" in text.out
    assert_bounded(as_json)
    doc = json.loads(as_json.out)
    assert as_json.rc == 1 and doc["schema"] == "torchdoctor/scan/1"
    assert {(t["path"], t["dtype"], tuple(t["shape"])) for t in doc["tensors"]} == {
        ("model.w", "float32", (3, 4)), ("model.h", "float16", (5,)), ("emb", "bfloat16", (7, 2))}
    assert {p["found"] for p in doc["problems"]} == {"float32", "float16"}


def test_dcp_metadata_payload_is_named_never_run(tmp_path, dcp_dir):
    from torch.distributed.checkpoint import FileSystemReader

    marker = tmp_path / "PWNED"
    d = tmp_path / "evil-dcp"
    d.mkdir()
    (d / "__0_0.distcp").write_bytes((dcp_dir / "__0_0.distcp").read_bytes())
    meta = FileSystemReader(str(dcp_dir)).read_metadata()
    meta.planner_data = {"model.w": hostile.Evil(marker)}
    (d / ".metadata").write_bytes(pickle.dumps(meta))
    (tmp_path / "only-evil").mkdir()
    (tmp_path / "only-evil" / ".metadata").write_bytes(pickle.dumps(hostile.Evil(marker)))
    (tmp_path / "only-evil" / "__0_0.distcp").write_bytes(b"")
    planted, alone = run_scans([["scan", str(d), "--json"], ["scan", str(tmp_path / "only-evil")]])
    assert not marker.exists()
    assert_bounded(planted)
    doc = json.loads(planted.out)
    assert planted.rc == 1 and {t["path"] for t in doc["tensors"]} == {"model.w", "model.h", "emb"}
    (p,) = doc["problems"]
    assert p["kind"] == "unsafe_global" and p["found"] == "posix.system" and "do not load this file" in p["message"]
    assert_bounded(alone)
    # what dcp.load's plain pickle.load would run is the finding: exit 1, named, never merely "unreadable"
    assert alone.rc == 1 and "posix.system" in alone.out and "can run code" in alone.out


_FSDP_SAVE = r"""
import sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 6, bias=False))
fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
dcp.save({"model": model.state_dict()}, checkpoint_id=sys.argv[1])
rank_file = f"{sys.argv[1]}/../model_rank{dist.get_rank()}.pt"
torch.save(model.state_dict(), rank_file)  # the other sharded form: one torch.save of DTensors per rank
dist.barrier()
assert type(torch.load(rank_file, weights_only=True)["0.weight"]).__name__ == "DTensor"  # torch accepts it
dist.destroy_process_group()
"""


def test_fsdp2_sharded_checkpoint_over_two_ranks(tmp_path):
    """accelerate's FSDP SHARDED_STATE_DICT layout: output_dir/pytorch_model_fsdp_0/ written by two gloo ranks."""
    script = tmp_path / "save_fsdp.py"
    script.write_text(_FSDP_SAVE)
    out = tmp_path / "output" / "pytorch_model_fsdp_0"
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    failures = []
    for _ in range(2):  # a gloo rendezvous on a loaded machine aborts now and then: one retry, both logs kept
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                               str(script), str(out)], capture_output=True, text=True, timeout=240, env=env)
        if proc.returncode == 0:
            break
        failures.append(proc.stderr[-2000:])
    assert proc.returncode == 0, failures
    assert sorted(os.listdir(out)) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    ref = _reference(out)
    (run,) = run_scans([["scan", str(tmp_path / "output"), "--json"]])
    assert_bounded(run)
    doc = json.loads(run.out)
    assert run.rc == 0, doc["problems"]
    prefix = "pytorch_model_fsdp_0/"
    shapes = {t["path"]: tuple(t["shape"]) for t in doc["tensors"]}
    assert {k: v for k, v in shapes.items() if k.startswith(prefix)} == {prefix + k: v[1] for k, v in ref.items()}
    for rank in (0, 1):  # per-rank DTensor files: global shapes, no false "unsafe global", the local bytes
        assert {k: v for k, v in shapes.items() if k.startswith(f"model_rank{rank}.pt/")} == {
            f"model_rank{rank}.pt/{k[len('model.'):]}": v[1] for k, v in ref.items()}
    by_file = {f["file"]: f for f in doc["files"]}
    assert by_file["model_rank0.pt"]["nbytes"] == (16 * 8 + 16 + 16 + 16 + 6 * 16) * 4 // 2
    assert "this file holds one rank's local shards" in by_file["model_rank1.pt"]["notes"][0]
    f = by_file["pytorch_model_fsdp_0"]
    assert f["format"] == "torch-dcp"
    sharding = f["sharding"]
    assert set(sharding) == {k for k, v in ref.items() if v[2] > 1} == {
        "model.0.weight", "model.0.bias", "model.1.weight", "model.1.bias", "model.2.weight"}
    assert sharding["model.0.weight"] == [{"offsets": [0, 0], "sizes": [8, 8]}, {"offsets": [8, 0], "sizes": [8, 8]}]
