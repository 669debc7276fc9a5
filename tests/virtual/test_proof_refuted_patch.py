"""A line fix whose virtual re-run still finds a problem at the very line it changes is refuted: its diff is never
offered as a patch (text or JSON), while the headline says what the re-run found. ``torch.ones(8).cuda()`` on a
cuda:1 run: the factory's ``device=`` does not change where ``.cuda()`` then sends it (hunt W29)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch

import torchdoctor
from support.apps import load_file

APP = """
    import torch, torch.nn as nn
    class M(nn.Module):
        def __init__(self):
            super().__init__(); self.lin = nn.Linear(8, 8)
        def forward(self, x):
            bias = torch.ones(8).cuda()
            return self.lin(x) + bias
"""


def test_a_refuted_line_fix_is_not_offered_as_a_patch(tmp_path: Path) -> None:
    path = tmp_path / "app.py"
    path.write_text(textwrap.dedent(APP))  # the ones line is line 7
    report = torchdoctor.simulate(load_file(path).M(), (torch.randn(2, 8),), device="cuda:1")
    [problem] = report.problems
    assert problem.found == "cuda:0" and "app.py:7" in problem.message
    text = str(report)
    assert "still found" in text and "Patch (git apply)" not in text
    assert report.to_dict()["patch"] is None
    assert all(not f.proven for f in report.fixes)
