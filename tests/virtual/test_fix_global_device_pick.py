"""A node that picks its device once at module level (ComfyUI-RMBG#205: ``device = "cuda" if
torch.cuda.is_available() else "cpu"``) runs its model on the cpu on an XPU or a Mac while the app is on the
accelerator. Moving the node's weights is undone by its own ``.to(node_device)``: the fix is the pick itself (a
diff), proven by a re-run with that name set to the run's device; the program with the diff applied, imported on
the device, runs quiet (issue 41 point 1, hunt T3)."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import torchdoctor
from support.apps import committed, load_file as _load

NODE = """\
    import torch
    from torch import nn

    node_device = "cuda" if torch.cuda.is_available() else "cpu"


    class Seg(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 1, 3, padding=1)

        def forward(self, x):
            return torch.sigmoid(self.conv(x))


    class Node(nn.Module):
        def __init__(self):
            super().__init__()
            self.seg, self.refine = Seg(), nn.Conv2d(3, 3, 1)


    def app(m, device="xpu"):
        m.refine.to(device)
        m.seg.to(node_device)
        image = torch.rand(1, 3, 8, 8, device=device)
        mask = m.seg(image.to(node_device))
        return m.refine(image) * mask
"""



@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_a_module_level_cuda_or_cpu_pick_is_fixed_where_it_is_made(tmp_path: Path) -> None:
    path = tmp_path / "rmbg.py"
    path.write_text(textwrap.dedent(NODE), encoding="utf-8")
    committed(tmp_path, "node")
    mod = _load(path, "rmbg_node")
    r = torchdoctor.simulate(mod.Node(), device="xpu", call=mod.app)
    assert [p.kind for p in r.problems] == ["device"]
    [fix] = r.fixes
    assert fix.proven, fix.tried
    assert "moves its component to node_device = \"cuda\" if torch.cuda.is_available() else \"cpu\" (" in fix.code
    assert "which is cpu here while the run is on xpu:0: pick the device torch finds" in fix.code
    assert "seg.conv.weight" not in fix.code  # never a move its own .to(node_device) undoes
    assert mod.node_device == "cpu"  # the re-run's name put back
    assert fix.diff is not None and '+node_device = torch.accelerator.current_accelerator().type if ' \
        'torch.accelerator.is_available() else "cpu"\n' in fix.diff
    (tmp_path / "fix.diff").write_text(fix.diff, encoding="utf-8")
    done = subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr

    def imported_on_the_device(m: Any) -> Any:  # as the node's module is imported on the real machine
        return _load(path, "rmbg_node_fixed").app(m)

    again = torchdoctor.simulate(mod.Node(), device="xpu", call=imported_on_the_device)
    assert again.ok, str(again)
    before = torchdoctor.simulate(mod.Node(), device="xpu", call=mod.app)
    assert not before.ok  # the unfixed module still fails: the check can fail
