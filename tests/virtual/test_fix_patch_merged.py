"""Fixes of nearby lines of one file are printed and carried as one patch that ``git apply`` takes whole (hunt s15
V19, weecology/DeepForest#1214: two predictions made under bf16 autocast read with ``.numpy()`` on adjacent lines;
each one-line diff quoted the other's old line as context, so after the first the second no longer applied)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import torchdoctor
from support.apps import load_file as _load

APP = """
    import torch
    from torch import nn

    class Head(nn.Module):
        def __init__(self):
            super().__init__(); self.box = nn.Linear(8, 4); self.score = nn.Linear(8, 1)
        def forward(self, h):
            return {"boxes": self.box(h), "scores": self.score(h)}

    def build():
        return Head()

    def app(m, device="cuda:0"):
        m.to(device)
        with torch.no_grad(), torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            pred = m(torch.rand(2, 8, device=device))
        boxes = pred["boxes"].cpu().numpy()
        scores = pred["scores"].cpu().numpy()
        return boxes, scores
"""



def test_two_adjacent_fixes_are_one_patch_that_applies_and_runs(tmp_path: Path) -> None:
    path = tmp_path / "boxes_app.py"
    path.write_text(textwrap.dedent(APP), encoding="utf-8")
    mod = _load(path, "_td_boxes_app")
    report = torchdoctor.simulate(mod.build(), device="cuda:0", call=mod.app)  # type: ignore[attr-defined]
    assert not report.ok
    text = report.text()
    assert text.count("Patch (git apply):") == 1, text
    doc = report.to_dict()
    assert sum(1 for f in doc["fixes"] if f["diff"]) == 2, doc["fixes"]
    patch = doc["patch"]
    assert patch and patch.count("\n@@ ") == 1 and patch.count("\n+ ") == 2, patch
    proc = subprocess.run(["git", "apply", "--unsafe-paths", "-p1", "--directory", "."], input=patch,
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    fixed = path.read_text(encoding="utf-8")
    assert 'pred["boxes"].cpu().float().numpy()' in fixed and 'pred["scores"].cpu().float().numpy()' in fixed, fixed
    again = _load(path, "_td_boxes_app_fixed")
    assert torchdoctor.simulate(again.build(), device="cuda:0", call=again.app).ok  # type: ignore[attr-defined]
    sys.modules.pop("_td_boxes_app", None)
    sys.modules.pop("_td_boxes_app_fixed", None)
