"""Session 12's hunt, guard (issue 41 points 1, 2, 5): each report's printed fix is aimed at the maker, and applied
to the user's file (its ``git apply`` diff, or the printed line) the program runs."""

from __future__ import annotations

import importlib.util
import pathlib
import shutil
import subprocess
import sys
import types
from typing import Any

import pytest
import torch

import torchdoctor

BF = torch.bfloat16


def _git(repo: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60)


@pytest.fixture()
def project(tmp_path: pathlib.Path) -> pathlib.Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "proj"
    root.mkdir()
    assert _git(root, "init", "-q").returncode == 0
    return root


def _load(path: pathlib.Path, name: str, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, mod)  # inspect reads a class's source through its module
    spec.loader.exec_module(mod)
    return mod


def _fails(mod: types.ModuleType, mode: str) -> Any:
    """The error ``mod.app`` raises under guard in ``mode`` (a PlacementError, or the error it explained)."""
    model = mod.build()
    with pytest.raises(Exception) as info:
        with torchdoctor.guard(model, mode=mode):
            mod.app(model)
    return info.value


def _applied(project: pathlib.Path, patch: str | None, name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The patch applied with git, the file loaded again and its ``app`` run under strict guard: its result."""
    assert patch is not None
    (project / "fix.patch").write_text(patch)
    done = _git(project, "apply", "fix.patch")
    assert done.returncode == 0, done.stderr
    fixed = _load(project / "app.py", name, monkeypatch)
    model = fixed.build()
    with torchdoctor.guard(model, mode="strict"):
        return fixed.app(model)


def _reset(project: pathlib.Path, source: str) -> None:
    (project / "app.py").write_text(source)


DTYPE_NONE = '''\
import torch
from torch import nn


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        gate = torch.ones(4, dtype=None)
        return self.b(self.a(x) * gate)


def build():
    return Gate().to(torch.bfloat16)


def app(m):
    return m(torch.ones(2, 4, dtype=torch.bfloat16))
'''


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_a_factory_told_dtype_none_is_a_default_dtype_factory(project: pathlib.Path, mode: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _reset(project, DTYPE_NONE)
    err = _fails(_load(project / "app.py", f"td_h3_none_{mode}", monkeypatch), mode)
    assert "made by `torch.ones` at " in str(err) and "app.py:12" in str(err)
    assert err.fix == "gate = torch.ones(4, dtype=torch.bfloat16)  # app.py:12"
    assert "-        gate = torch.ones(4, dtype=None)\n+        gate = torch.ones(4, dtype=torch.bfloat16)\n" in err.patch
    assert err.proof.startswith("fix proven")
    assert _applied(project, err.patch, f"td_h3_none_{mode}_fixed", monkeypatch).dtype == BF


def test_strict_on_every_op_stops_at_the_promoting_mul_of_a_dtype_none_factory(
        project: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _reset(project, DTYPE_NONE)
    mod = _load(project / "app.py", "td_h3_none_every", monkeypatch)
    model = mod.build()
    with pytest.raises(torchdoctor.PlacementError) as info:
        with torchdoctor.guard(model, mode="strict", every_op=True):
            mod.app(model)
    assert info.value.op == "aten.mul.Tensor" and "promotes the model's bfloat16" in str(info.value)
    assert info.value.fix == "gate = torch.ones(4, dtype=torch.bfloat16)  # app.py:12"


NUMPY = '''\
import numpy as np
import torch
from torch import nn


def build():
    return nn.Sequential(nn.Linear(8, 12), nn.Sigmoid()).to(torch.bfloat16)


def save(images):
    arr = (255.0 * images.cpu().numpy()).clip(0, 255).astype(np.uint8)
    return np.asarray(images.detach()).shape, arr


@torch.inference_mode()
def app(m):
    images = m(torch.randn(1, 8, dtype=torch.bfloat16)).view(-1, 2, 2, 3)
    return save(images)
'''


@pytest.mark.parametrize("mode", ["explain", "strict", "fix"])
def test_numpy_of_a_bf16_tensor_is_explained_with_the_cast_at_its_line(project: pathlib.Path, mode: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _reset(project, NUMPY)
    err = _fails(_load(project / "app.py", f"td_h3_np_{mode}", monkeypatch), mode)
    assert isinstance(err, TypeError)  # the program's own error, with guard's note
    said = "\n".join(getattr(err, "__notes__", [])) or str(err)
    assert "`images.cpu().numpy()` converts a bfloat16 tensor, and numpy has no bfloat16" in said
    assert "fix proven: `images.float().cpu().numpy()` runs (ndarray of float32)" in said
    assert "arr = (255.0 * images.float().cpu().numpy()).clip(0, 255).astype(np.uint8)  # app.py:11" in said
    patch = said.split("Patch (git apply):\n", 1)[1]
    patch = "\n".join(line[4:] for line in patch.splitlines()) + "\n"
    (project / "fix.patch").write_text(patch)
    assert _git(project, "apply", "fix.patch").returncode == 0
    # the next conversion on the same path, np.asarray of the bf16 tensor, is told the same way at its own line
    err2 = _fails(_load(project / "app.py", f"td_h3_np_{mode}_2", monkeypatch), mode)
    said2 = "\n".join(getattr(err2, "__notes__", []))
    assert "return np.asarray(images.float().detach()).shape, arr  # app.py:12" in said2, said2
    assert "fix proven" in said2
