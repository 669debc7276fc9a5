"""A tensor the program's own line makes on the cpu by an op of its own, from lengths it took to the host
(``.tolist()``), then hands to an op on the accelerator: fixed where it is made, as a diff, with the device the
line's function was given (``.to(x.device)``), never a device written out; proven, and applied the program runs
clean on the virtual device and still runs on this cpu (hunt of the twenty-fifth session, F10).

Before, the fix was advice with a device written out (``tensor.to('cuda:0')``), unproven.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from run.test_run_cli import ENV, TIMEOUT, run, write

HEAD = """
    import torch, torch.nn as nn

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 32)
            self.dur = nn.Linear(32, 1)

        def forward(self, x, x_mask):
            h = self.proj(x)
            lens = x_mask.sum(-1).long().tolist()
"""
TAIL = """
    device = "cuda" if torch.cuda.is_available() else "cpu"
    enc = Encoder().to(device)
    x = torch.randn(2, 6, 16, device=device)
    x_mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], device=device)
    print("done", tuple(enc(x, x_mask).shape))
"""
MASK = HEAD + """
            mask = torch.arange(max(lens))[None, :] < torch.tensor(lens)[:, None]
            return h * mask.unsqueeze(-1)
""" + TAIL
SCALE = HEAD + """
            scale = torch.tensor(lens, dtype=torch.float32) / torch.arange(1, 3)
            return h * scale[:, None, None]
""" + TAIL


@pytest.mark.parametrize(("text", "want"), [
    (MASK, "mask = (torch.arange(max(lens))[None, :] < torch.tensor(lens)[:, None]).to(x.device)"),
    (SCALE, "scale = (torch.tensor(lens, dtype=torch.float32) / torch.arange(1, 3)).to(x.device)"),
], ids=["comparison", "arithmetic"])
def test_a_tensor_made_on_the_cpu_by_the_programs_line_is_moved_there(tmp_path: Path, text: str, want: str) -> None:
    app = write(tmp_path / "app.py", text)
    proc = run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path)
    report = json.loads(proc.stdout[proc.stdout.index("\n{") + 1:])
    fixes = [f for f in report["fixes"] if f["code"].startswith(want)]
    assert fixes and fixes[0]["proven"], report["fixes"]
    assert "made it on the cpu" in fixes[0]["code"]
    assert "'cuda:0'" not in report["patch"], report["patch"]
    subprocess.run(["git", "apply", "-"], input=report["patch"], cwd=tmp_path, text=True, check=True, timeout=60)
    again = run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path)
    assert json.loads(again.stdout[again.stdout.index("\n{") + 1:])["ok"], again.stdout[-3000:]
    real = subprocess.run([sys.executable, str(app)], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert real.returncode == 0, real.stderr[-2000:]
