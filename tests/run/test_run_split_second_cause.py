"""A program with two placement causes, one inside a model accelerate's ``dispatch_model`` spreads over two devices
(a residual that mixes two layers' outputs) and one in the program's own code (a tiled VAE decode handed latents
still on the first device): each gets its fix (hunt of the twenty-fifth session, F9).

The split layers are never moved by hand (the hooks place them), so the latents' move to the VAE's device undoes
nothing: it is printed, proven, and written with the VAE's own device (``next(self.post.parameters()).device``),
never a device written out. Applied, the VAE's problem is gone and only the residual's is left.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from run.test_run_cli import run, write

SPLIT = """
    import torch, torch.nn as nn
    from accelerate import dispatch_model

    class Transformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj_in = nn.Linear(4, 32)
            self.blocks = nn.ModuleList([nn.Linear(32, 32) for _ in range(2)])
            self.proj_out = nn.Linear(32, 4)

        def forward(self, x):
            h = self.proj_in(x)
            for b in self.blocks:
                h = h + b(h)
            return self.proj_out(h)

    class VAE(nn.Module):
        def __init__(self):
            super().__init__()
            self.post = nn.Conv2d(4, 4, 1)
            self.dec = nn.ConvTranspose2d(4, 3, 2, stride=2)

        def tiled_decode(self, z, tile=4):
            rows = []
            for i in range(0, z.shape[2], tile):
                row = []
                for j in range(0, z.shape[3], tile):
                    t = z[:, :, i:i + tile, j:j + tile]
                    row.append(self.dec(self.post(t)))
                rows.append(torch.cat(row, dim=3))
            return torch.cat(rows, dim=2)

    tr = dispatch_model(Transformer(), device_map={"proj_in": 0, "blocks.0": 0, "blocks.1": 1, "proj_out": 1})
    vae = VAE().to("cuda:1")
    lat = tr(torch.randn(1, 64, 4, device="cuda:0"))
    img = vae.tiled_decode(lat.transpose(1, 2).reshape(1, 4, 8, 8))
    print("done", tuple(img.shape))
"""


def _report(proc: subprocess.CompletedProcess[str]) -> dict:
    return json.loads(proc.stdout[proc.stdout.index("\n{") + 1:])


def test_the_second_cause_of_a_split_program_gets_its_proven_fix(tmp_path: Path) -> None:
    write(tmp_path / "app.py", SPLIT)
    report = _report(run("--device", "cuda:1", "--json", "app.py", cwd=tmp_path))
    assert any(p["path"] == "post" for p in report["problems"]), report["problems"]
    moved = [f for f in report["fixes"] if "self.post(t.to(next(self.post.parameters()).device))" in f["code"]]
    assert moved and moved[0]["proven"], report["fixes"]
    assert "'cuda:1'" not in report["patch"], report["patch"]
    subprocess.run(["git", "apply", "-"], input=report["patch"], cwd=tmp_path, text=True, check=True, timeout=60)
    again = _report(run("--device", "cuda:1", "--json", "app.py", cwd=tmp_path))
    assert not any(p["path"] == "post" for p in again["problems"]), again["problems"]
    assert again["problems"], "the residual across the split is still the program's to fix"
