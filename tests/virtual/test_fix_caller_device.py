"""A loader whose factories pass its own ``device`` parameter (``torch.randn(..., device=device)`` in ``def
load(self, model, device=None)``) makes its tensors on the cpu when one call leaves the parameter out (FreeFuse#7:
a LoRA reloaded after ``unload`` without ``device=``). The fix is that call, given ``device=`` (a diff `git apply`
takes), proven for every factory of the loader (``down`` and ``up`` both), never a device hard-coded into the
factory (issue 41 point 1, hunt T2)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import torchdoctor
from support.apps import committed, load_file as _load

APP = """\
    import torch
    from torch import nn


    class Loader:
        def __init__(self):
            self.orig = {}

        def load(self, model, device=None, dtype=torch.float32):
            for name, lin in model.named_modules():
                if not isinstance(lin, nn.Linear):
                    continue
                down = torch.randn(2, lin.in_features, dtype=dtype, device=device)
                up = torch.zeros(lin.out_features, 2, dtype=dtype, device=device)
                self.orig[name] = lin.forward

                def bypass(x, down=down, up=up, f=lin.forward):
                    return f(x) + torch.mm(torch.mm(x, down.t().to(x.dtype)), up.t().to(x.dtype))
                lin.forward = bypass

        def unload(self, model):
            for name, lin in model.named_modules():
                if name in self.orig:
                    lin.forward = self.orig.pop(name)


    def build():
        return nn.Sequential(nn.Linear(8, 24), nn.GELU(), nn.Linear(24, 8))


    def app(m, device="cuda:0"):
        loader = Loader()
        m.to(device, torch.bfloat16)
        loader.load(m, device=device)
        m(torch.randn(1, 8, device=device, dtype=torch.bfloat16))
        loader.unload(m)
        loader.load(m)
        return m(torch.randn(1, 8, device=device, dtype=torch.bfloat16))
"""



def _repo(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "reload.py"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    committed(tmp_path, "app")
    return path


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_the_call_without_device_is_fixed_and_proven(tmp_path: Path) -> None:
    path = _repo(tmp_path, APP)
    mod = _load(path, "reload_caller")
    r = torchdoctor.simulate(mod.build(), device="cuda:0", dtype=torch.bfloat16, call=mod.app)
    assert r.problems and all("made by torch.randn in code outside the model at " in p.message and
                              "reload.py:13 " in p.message for p in r.problems)
    [fix] = r.fixes
    assert fix.code.startswith("# load(...) at ") and fix.code.endswith(
        "reload.py:13 and the factories beside it make their tensors on the cpu): pass it "
        "(loader.load(m, device=device))")
    assert "reload.py:37 is called without device= (device defaults to None, so torch.randn at " in fix.code
    assert fix.proven, fix.tried
    assert fix.diff is not None and "-    loader.load(m)\n+    loader.load(m, device=device)\n" in fix.diff
    assert "device='cuda:0'" not in fix.diff  # never hard-coded into the loader's factories
    (tmp_path / "fix.diff").write_text(fix.diff, encoding="utf-8")
    done = subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    fixed = _load(path, "reload_caller_fixed")
    again = torchdoctor.simulate(fixed.build(), device="cuda:0", dtype=torch.bfloat16, call=fixed.app)
    assert again.ok, str(again)
    assert "reload_caller" not in sys.modules


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_two_calls_without_device_are_not_guessed(tmp_path: Path) -> None:
    path = _repo(tmp_path, APP.replace("loader.load(m, device=device)", "loader.load(m)"))
    mod = _load(path, "reload_two_calls")
    r = torchdoctor.simulate(mod.build(), device="cuda:0", dtype=torch.bfloat16, call=mod.app)
    assert r.problems and not any("is called without device=" in f.code for f in r.fixes)
