"""A tensor made by two lines together — a cast's result times a factory's tensor given no dtype (``s = x.float()``,
``w = torch.linspace(...)``, ``g = w * s``) — is named by both when the failing op meets it, in the CPU dtype check
of a float16 run: each line is fixed (the cast's dtype, the factory's ``dtype=``), proven by a re-run, and the file
patched with the report's diff runs clean. One maker alone would leave the other's float32, promoted (hunt U30)."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

import torchdoctor
from support.apps import committed, load_file

APP = """
    import torch, torch.nn as nn
    class M(nn.Module):
        def __init__(self):
            super().__init__(); self.lin = nn.Linear(8, 8)
        def forward(self, x):
            s = x.float()
            w = torch.linspace(0, 1, 8, device=x.device)
            g = (w * s).sigmoid() * s
            return self.lin(g)
"""


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_each_maker_of_a_mix_is_fixed_and_the_patch_runs_clean(tmp_path: Path) -> None:
    path = tmp_path / "app.py"
    path.write_text(textwrap.dedent(APP))
    committed(tmp_path)
    report = torchdoctor.simulate(load_file(path).M(), (torch.randn(2, 8),), device="cpu", dtype=torch.float16)
    [problem] = report.problems
    assert "app.py:8 (no dtype given)" in problem.message and "app.py:7 in `<root>`" in problem.message
    assert problem.message.startswith("a tensor made from torch.linspace at ")
    assert len(report.fixes) == 2 and all(f.proven for f in report.fixes)
    patch = report.to_dict()["patch"]  # the two one-line diffs merged into one git apply takes
    assert "+        s = x.to(torch.float16)\n" in patch and "linspace(0, 1, 8, device=x.device, dtype=x.dtype)" in patch
    (tmp_path / "fix.diff").write_text(patch)
    subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, check=True, timeout=60)
    assert torchdoctor.simulate(load_file(path).M(), (torch.randn(2, 8),), device="cpu", dtype=torch.float16).ok


class Quiet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.to(self.lin.weight.dtype)
        w = torch.linspace(0, 1, 8, device=x.device, dtype=x.dtype)
        return self.lin(w * s)


def test_a_mix_of_makers_in_the_dtype_is_quiet() -> None:
    assert torchdoctor.simulate(Quiet(), (torch.randn(2, 8),), device="cpu", dtype=torch.float16).ok
