"""A user's app file for a test: for a CLI TARGET, written into the test's folder, which becomes the working directory
and the first entry of ``sys.path`` (as ``torchdoctor scan app.py:model`` run from that folder would have it); for a
fix's diff, loaded from its file (``load_file``) in a folder git knows (``committed``), so ``git apply`` takes it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

GIT = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]


def app_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str) -> Path:
    (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def load_file(path: Path, name: str | None = None) -> Any:
    """The module in ``path``, loaded afresh under ``name`` (by default one unique to the file and its contents'
    time, so a file changed by a diff loads again as new), never put in ``sys.modules``."""
    name = name or f"_td_app_{path.parent.name}_{path.stem}_{path.stat().st_mtime_ns}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def committed(folder: Path, message: str = "app") -> None:
    """``folder`` made a git repository holding its files, committed: a diff of them applies with ``git apply``."""
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-qm", message]):
        subprocess.run([*GIT, *cmd], cwd=folder, check=True, timeout=60)


def run_json(path: Path, device: str) -> Any:
    """``torchdoctor run --device DEVICE --json`` of the app at ``path``, run from its folder: the JSON document."""
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", device, "--json", path.name],
                          cwd=path.parent, capture_output=True, text=True, timeout=300)
    return json.loads(proc.stdout[proc.stdout.index('{\n  "schema"'):])
