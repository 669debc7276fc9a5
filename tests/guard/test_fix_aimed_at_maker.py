"""Issue 41 points 1-2 for guard: an operand made in a forward is named with its maker (the cast or factory call,
its line, where the dtype was read from) and the fix is aimed there, proven by re-running the module, and offered as
a unified diff of the user's file that ``git apply`` takes, after which the error is gone."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import pickle
import shutil
import subprocess
import sys
import types

import pytest
import torch

import torchdoctor

LAYERS = '''\
import torch
from torch import nn


class QLinear(nn.Module):
    compute_dtype = torch.bfloat16

    def __init__(self, n):
        super().__init__()
        self.register_buffer("qweight", torch.randint(-8, 8, (n, n), dtype=torch.int8))
        self.weight_scale = nn.Parameter(torch.ones(n, 1), requires_grad=False)

    def forward(self, x):
        w = self.qweight.to(self.compute_dtype) * self.weight_scale.to(self.compute_dtype)
        return x @ w.t()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.q = QLinear(8)

    def forward(self, x):
        return self.q(self.inp(x))


class Upcast(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, x):
        h = self.inp(x).float()
        return self.out(h)


class Mask(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 8)

    def forward(self, x):
        mask = torch.ones(8, 8)
        return self.inp(x) @ mask
'''


def _git(repo: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60)


def _load(path: pathlib.Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # inspect reads a class's source through its module
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture()
def project(tmp_path: pathlib.Path, request: pytest.FixtureRequest) -> pathlib.Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "proj"
    root.mkdir()
    assert _git(root, "init", "-q").returncode == 0
    (root / "layers.py").write_text(LAYERS)
    return root


def _net(project: pathlib.Path, name: str) -> tuple[types.ModuleType, torch.nn.Module]:
    mod = _load(project / "layers.py", name)
    net = mod.Net().half()
    net.q.weight_scale.data = net.q.weight_scale.data.float()  # the fp32 scale: not what the op meets
    return mod, net


def _fail(model: torch.nn.Module, x: torch.Tensor, mode: str) -> torchdoctor.PlacementError:
    with pytest.raises(torchdoctor.PlacementError) as info:
        with torchdoctor.guard(model, mode=mode):
            model(x)
    return info.value


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_a_class_attribute_compute_dtype_is_the_fix_and_its_patch_makes_the_error_go_away(
        project: pathlib.Path, mode: str) -> None:
    mod, net = _net(project, f"td_layers_{mode}")
    x = torch.randn(2, 8, dtype=torch.float16)
    err = _fail(net, x, mode)
    text = str(err)
    assert "made by `.to(self.compute_dtype)` at " in text
    assert "layers.py:14" in text and "the dtype read from class attribute `QLinear.compute_dtype`" in text
    assert (err.fix or "").startswith("type(model.q).compute_dtype = torch.float16")
    assert "weight_scale" not in (err.fix or "")  # the old advice: casting it leaves the error in place
    assert err.proof == "fix proven: QLinear runs again with compute_dtype = torch.float16 on `QLinear`"
    assert "compute_dtype" not in vars(net.q) and mod.QLinear.compute_dtype == torch.bfloat16  # put back
    patch = err.patch
    assert patch is not None and patch.startswith("--- a/layers.py\n+++ b/layers.py\n")
    assert "-    compute_dtype = torch.bfloat16\n+    compute_dtype = torch.float16\n" in patch
    data = err.to_dict()
    assert data["patch"] == patch and data["proof"] == err.proof and json.loads(json.dumps(data)) == data
    assert pickle.loads(pickle.dumps(err)).to_dict()["patch"] == patch  # the error crosses processes intact
    (project / "fix.patch").write_text(patch)
    applied = _git(project, "apply", "fix.patch")
    assert applied.returncode == 0, applied.stderr
    _, fixed = _net(project, f"td_layers_{mode}_fixed")
    with torchdoctor.guard(fixed, mode="strict"):
        assert fixed(x).dtype == torch.float16  # the printed fix, applied, makes the error go away


def test_a_float_call_in_forward_is_named_and_patched_to_the_models_dtype(project: pathlib.Path) -> None:
    mod = _load(project / "layers.py", "td_layers_upcast")
    net = mod.Upcast().to(torch.bfloat16)
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    err = _fail(net, x, "strict")
    assert "made by `.float()` at " in str(err) and "(`h = self.inp(x).float()`)" in str(err)
    assert err.patch is not None
    assert "-        h = self.inp(x).float()\n+        h = self.inp(x).to(torch.bfloat16)\n" in err.patch
    assert err.proof is not None and err.proof.startswith("fix proven")
    (project / "fix.patch").write_text(err.patch)
    assert _git(project, "apply", "fix.patch").returncode == 0
    fixed = _load(project / "layers.py", "td_layers_upcast_fixed").Upcast().to(torch.bfloat16)
    with torchdoctor.guard(fixed, mode="strict"):
        assert fixed(x).dtype == torch.bfloat16


def test_a_factory_in_forward_is_named_with_its_line(project: pathlib.Path) -> None:
    mod = _load(project / "layers.py", "td_layers_mask")
    net = mod.Mask().to(torch.bfloat16)
    err = _fail(net, torch.randn(2, 8, dtype=torch.bfloat16), "strict")
    assert "made by `torch.ones` at " in str(err) and "(`mask = torch.ones(8, 8)`)" in str(err)
    assert "layers.py:45" in str(err)
    # the factory's line given the dtype, as code, as a diff, and applied the error is gone
    assert err.fix == "mask = torch.ones(8, 8, dtype=torch.bfloat16)  # layers.py:45"
    assert err.proof is not None and err.proof.startswith("fix proven")
    assert err.patch is not None and "-        mask = torch.ones(8, 8)\n+        mask = torch.ones(8, 8, dtype=torch.bfloat16)\n" \
        in err.patch
    (project / "fix.patch").write_text(err.patch)
    assert _git(project, "apply", "fix.patch").returncode == 0
    fixed = _load(project / "layers.py", "td_layers_mask_fixed").Mask().to(torch.bfloat16)
    with torchdoctor.guard(fixed, mode="strict"):
        assert fixed(torch.randn(2, 8, dtype=torch.bfloat16)).dtype == torch.bfloat16
