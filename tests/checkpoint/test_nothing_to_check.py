"""A checkpoint TARGET with nothing checkable is exit 2, "holds no tensors", as ``scan`` says for an object; a
finding still wins over it; and any file name works, valid UTF-8 or not."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import torch

from checkpoint import containers
from checkpoint.capped import assert_bounded, run_scans

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}


def _nested(depth: int) -> object:
    value: object = {"leaf": [1, 2.5, "x"]}
    for i in range(depth):
        value = [value, {"level": i}] if i % 2 else {"inner": value, "n": i}
    return value


def test_deep_nested_containers_without_a_tensor_are_exit_2(tmp_path):
    (tmp_path / "deep.pkl").write_bytes(pickle.dumps(_nested(400)))  # deeper than the walk goes
    (tmp_path / "shallow.pkl").write_bytes(pickle.dumps({"epoch": 3, "names": ["a", "b"]}))
    sched = torch.optim.lr_scheduler.StepLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), 1)
    torch.save(sched.state_dict(), tmp_path / "scheduler.pt")
    runs = run_scans([["scan", str(tmp_path / n)] for n in ("deep.pkl", "shallow.pkl", "scheduler.pt")])
    for run, what in zip(runs, ("a pickle file", "a pickle file", "a torch-zip file")):
        assert_bounded(run)
        assert run.rc == 2 and run.out == "", run
        assert f"holds no tensors ({what}); point TARGET at a checkpoint" in run.err, run.err
        assert run.err.count("\n") == 1


def test_a_finding_wins_over_holding_no_tensors(tmp_path):
    (tmp_path / "evil.pkl").write_bytes(containers.evil(str(tmp_path / "MARKER")))
    (run,) = run_scans([["scan", str(tmp_path / "evil.pkl")]])
    assert run.rc == 1 and "can run code" in run.out, run
    assert not (tmp_path / "MARKER").exists()


def test_a_checkpoint_whose_name_is_not_utf8(tmp_path):
    name = b"\xff\xfeck.pt"
    with open(os.path.join(os.fsencode(tmp_path), name), "wb") as f:
        torch.save({"w": torch.zeros(2, dtype=torch.bfloat16)}, f)
    for extra in ([], [b"--json"]):
        run = subprocess.run([sys.executable, b"-m", b"torchdoctor", b"scan", name, *extra], cwd=tmp_path,
                             capture_output=True, env=ENV, timeout=300)
        assert run.returncode == 0, run.stderr
        assert b"Traceback" not in run.stderr
    doc = json.loads(run.stdout)
    assert [t["dtype"] for t in doc["tensors"]] == ["bfloat16"] and doc["ok"] is True
