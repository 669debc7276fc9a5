"""The pre-commit hooks of .pre-commit-hooks.yaml: their ``files`` patterns compiled as pre-commit compiles them
(Python ``re``, searched in the path relative to the repository root) against names torch, torch.export and DCP
load, and their entries run on real files."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from checkpoint import containers

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}


def _hooks() -> dict[str, dict]:
    import yaml

    return {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}


def _selects(hook: dict, name: str) -> bool:
    """pre-commit's filename filter: ``files`` searched, ``exclude`` (default ``^$``) not."""
    return bool(re.compile(hook["files"]).search(name)) and not re.compile(hook.get("exclude", "^$")).search(name)


LOADABLE = ["model.pt", "MODEL.PT", "weights.Pth", "checkpoint.pth.tar", "best.PT.TAR", "data.pickle", "state.pkl",
            "exported.pt2", "ckpt/.metadata", ".metadata", "ckpt/__0_0.distcp", "model.safetensors",
            "models/llama/pytorch_model.bin", "random_states_0.pkl", "last.ckpt", "Model.SafeTensors"]
NO_EXTENSION = ["weights", "models/checkpoint", "LICENSE", "Makefile"]
OTHER = ["README.md", "src/app.py", "release.tar", "foo.metadata", "notes.txt", "image.png", ".gitignore"]


def test_every_name_torch_loads_is_selected_by_one_hook():
    hooks = _hooks()
    by_name, by_content = hooks["torchdoctor-checkpoints"], hooks["torchdoctor-checkpoints-by-content"]
    for name in LOADABLE:
        assert _selects(by_name, name) and not _selects(by_content, name), name
    for name in NO_EXTENSION:
        assert _selects(by_content, name) and not _selects(by_name, name), name
    for name in OTHER:
        assert not _selects(by_name, name) and not _selects(by_content, name), name
    assert by_name["entry"].split()[:2] == ["torchdoctor", "scan"]
    assert by_content["entry"] == "python -m torchdoctor._checkpoint.hook"
    assert all(h["types"] == ["file"] and h["language"] == "python" for h in hooks.values())


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=ENV, cwd=cwd, timeout=300)


def test_by_content_hook_scans_checkpoints_and_skips_the_rest(tmp_path):
    marker = tmp_path / "MARKER"
    (tmp_path / "LICENSE").write_text("MIT License\n")
    (tmp_path / "logo").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    (tmp_path / "vocab").write_bytes(pickle.dumps({"a": 1, "b": [1, 2]}))
    torch.save({"w": torch.zeros(2)}, tmp_path / "weights")
    torch.save({"w": torch.zeros(2)}, tmp_path / "old", _use_new_zipfile_serialization=False)
    argv = ["-m", "torchdoctor._checkpoint.hook", "LICENSE", "logo", "vocab", "weights", "old"]
    run = _run(argv, tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "LICENSE: skipped, not a pickle, torch.save zip, torch < 0.4 tar or safetensors file" in run.stdout
    assert "logo: skipped" in run.stdout
    assert "vocab: skipped, a pickle of plain data" in run.stdout
    assert "weights: 1 tensors" in run.stdout and "old: 1 tensors" in run.stdout
    (tmp_path / "payload").write_bytes(containers.v7_tar(str(marker)))
    (tmp_path / "zipped").write_bytes(containers.zip_upper_case(str(marker)))
    (tmp_path / "plain").write_bytes(containers.evil(str(marker)))
    run = _run(["-m", "torchdoctor._checkpoint.hook", "LICENSE", "payload", "zipped", "plain"], tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stdout.count("can run code") == 3 and not marker.exists()


@pytest.mark.parametrize("name", ["MODEL.PT", "checkpoint.pth.tar", "state.pickle"])
def test_by_name_hook_entry_flags_payloads_in_any_case(tmp_path, name):
    marker = tmp_path / "MARKER"
    (tmp_path / name).write_bytes(containers.evil(str(marker)))
    run = _run(["-m", "torchdoctor", "scan", "-q", name], tmp_path)
    assert run.returncode == 1 and "can run code" in run.stdout, run.stdout + run.stderr
    assert not marker.exists()


def test_a_dcp_file_alone_scans_its_directory(tmp_path):
    marker = tmp_path / "MARKER"
    d = containers.dcp_with_value(tmp_path / "ckpt", str(marker))
    shard = next(p.name for p in d.iterdir() if p.suffix == ".distcp")
    for name in (".metadata", shard):
        run = _run(["-m", "torchdoctor", "scan", "-q", f"ckpt/{name}"], tmp_path)
        assert run.returncode == 1 and "can run code" in run.stdout, run.stdout + run.stderr
        assert "w" in run.stdout and "1 tensors" in run.stdout
    assert not marker.exists()
