"""A forward's helper that caches a grid in a module-level dict, moved with a module-level device pick
(``device = torch.device("cuda" if torch.cuda.is_available() else "cpu")``, RIFE's warp, Practical-RIFE PR #156):
on a Mac that pick is the cpu while the flow is on mps. The fix is code at the caching line — the grid moved to the
device of the tensor it meets there (``.to(flow.device)``), with the pick named — a patch, proven, in ``run`` and
in ``simulate`` alike; never a comment with a made-up ``x``."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import torch

import torchdoctor
from run.test_run_cli import run, write

WARP = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    grids = {}


    def warp(img, flow):
        k = (str(flow.device), str(flow.size()))
        if k not in grids:
            h = torch.linspace(-1.0, 1.0, 8, device=device).view(1, 1, 1, -1).expand(1, -1, 8, -1)
            v = torch.linspace(-1.0, 1.0, 8, device=device).view(1, 1, -1, 1).expand(1, -1, -1, 8)
            grids[k] = torch.cat([h, v], 1).to(device)
        g = (grids[k] + flow).permute(0, 2, 3, 1)
        return F.grid_sample(img, g, align_corners=True)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.flow = nn.Conv2d(3, 2, 3, padding=1)

        def forward(self, img):
            return warp(img, self.flow(img))
"""
MAIN = """
    import torch
    from warp import Net

    dev = torch.device("cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu")
    net = Net().to(dev).eval()
    with torch.no_grad():
        print("shape", tuple(net(torch.rand(1, 3, 8, 8, device=dev)).shape))
"""
FIXED = "+        grids[k] = torch.cat([h, v], 1).to(flow.device)"
PICK = '(`device` is picked once at module level, warp.py:6: `device = torch.device("cuda" if ' \
    'torch.cuda.is_available() else "cpu")`)'


def test_run_fixes_the_cached_grid_at_its_line_and_names_the_module_level_pick(tmp_path: Path) -> None:
    write(tmp_path / "warp.py", WARP)
    write(tmp_path / "main.py", MAIN)
    proc = run("--device", "mps", "main.py", cwd=tmp_path)
    out = proc.stdout + proc.stderr
    fix = out[out.index("\nFix"):]
    assert "warp.py:15: torch.cat([h, v], 1).to(device) sends it to cpu, not to the device of flow, which it meets " \
           "at warp.py:16" in fix and PICK in fix, out
    assert "# fix proven" in fix and "e.g. .to(x.device)" not in fix, out
    diff = out.split("Patch (git apply):\n", 1)[1]
    diff = "\n".join(line[4:] for line in diff.splitlines() if line.startswith("    ")) + "\n"
    assert FIXED in diff, diff
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "p.diff").write_text(diff)
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True, timeout=60)
    again = run("--device", "mps", "main.py", cwd=tmp_path)
    said = again.stdout + again.stderr
    assert "no placement error" in said and "shape (1, 3, 8, 8)" in said, said


def test_simulate_gives_the_same_patch(tmp_path: Path) -> None:
    path = write(tmp_path / "warp.py", WARP)
    spec = importlib.util.spec_from_file_location("warp_sim", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["warp_sim"] = mod
    try:
        spec.loader.exec_module(mod)
        report = torchdoctor.simulate(mod.Net().eval(), (torch.rand(1, 3, 8, 8),), "mps")
    finally:
        sys.modules.pop("warp_sim", None)
    assert report.fix is not None and "grids[k] = torch.cat([h, v], 1).to(flow.device)" in report.fix, report
    assert PICK in report.fix and "e.g. .to(x.device)" not in report.fix, report.fix
    assert FIXED in str(report), report
