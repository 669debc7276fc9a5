"""Adapters of the program's own class built after the model was moved (ComfyUI's TrainLoraNode: ``lin.adapter =
LoraAdapter(8, 8)`` after ``m.to(device, dtype)``, then an optimizer over them) stay on the cpu. The fix is the line
that builds them, moved there (a diff `git apply` takes), proven by a re-run with that line changed: never
``model.a.adapter.up.data = ...`` lines under an optimizer that already holds them (issue 41 point 1, hunt T8)."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
import torch

import torchdoctor
from support.apps import committed, load_file as _load

APP = """\
    import torch
    import torch.nn.functional as F
    from torch import nn


    class LoraAdapter(nn.Module):
        def __init__(self, out_f, in_f, rank=2):
            super().__init__()
            self.up = nn.Parameter(torch.zeros(out_f, rank))
            self.down = nn.Parameter(torch.randn(rank, in_f) * 0.01)


    class PatchedLinear(nn.Linear):
        def forward(self, x):
            w = self.weight
            if getattr(self, "adapter", None) is not None:
                w = w + (self.adapter.up @ self.adapter.down).to(w.dtype)
            return F.linear(x, w, self.bias)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = PatchedLinear(8, 8), PatchedLinear(8, 8)

        def forward(self, x):
            return self.b(F.silu(self.a(x)))


    def train(m, device="cuda:0", dtype=torch.bfloat16):
        m.to(device, dtype).requires_grad_(False)
        for lin in (m.a, m.b):
            lin.adapter = LoraAdapter(8, 8)
        opt = torch.optim.SGD([p for lin in (m.a, m.b) for p in lin.adapter.parameters()], lr=1e-3)
        loss = m(torch.randn(2, 8, device=device, dtype=dtype)).float().pow(2).mean()
        loss.backward()
        opt.step()
        return loss.detach()
"""



@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_adapters_built_after_the_move_are_fixed_where_they_are_built(tmp_path: Path) -> None:
    path = tmp_path / "trainlora.py"
    path.write_text(textwrap.dedent(APP), encoding="utf-8")
    committed(tmp_path, "app")
    mod = _load(path, "trainlora_built")
    r = torchdoctor.simulate(mod.Net(), device="cuda:0", dtype=torch.bfloat16, call=mod.train)
    assert {p.path for p in r.problems if p.role == "parameter"} == {"a.adapter.up", "a.adapter.down",
                                                                      "b.adapter.up", "b.adapter.down"}
    [fix] = r.fixes
    assert fix.code == ("# 2 LoraAdapter modules are built at trainlora.py:33 after the model was moved, on the cpu: "
                        "move them where they are built (LoraAdapter(8, 8).to(device, dtype))")
    assert fix.proven, fix.tried
    assert ".data" not in fix.code and LoraAdapter_untouched(mod)
    assert fix.diff is not None and \
        "-        lin.adapter = LoraAdapter(8, 8)\n+        lin.adapter = LoraAdapter(8, 8).to(device, dtype)\n" in fix.diff
    (tmp_path / "fix.diff").write_text(fix.diff, encoding="utf-8")
    done = subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    fixed = _load(path, "trainlora_built_fixed")
    again = torchdoctor.simulate(fixed.Net(), device="cuda:0", dtype=torch.bfloat16, call=fixed.train)
    assert again.ok, str(again)


def LoraAdapter_untouched(mod: ModuleType) -> bool:  # noqa: N802  # the re-run's wrapper put back
    return "__init__" in vars(mod.LoraAdapter) and vars(mod.LoraAdapter)["__init__"].__module__ == mod.__name__
