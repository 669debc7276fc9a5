"""A CPU ``torch.Generator`` handed to a random factory on the accelerator: the fix draws on the generator's device
and moves the draw where the program asked for it (diffusers' ``randn_tensor``), so the patched program runs clean;
never a ``device='cpu'`` edit that leaves the tensor off the run's device (whose own fix would put it back)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.apps import run_json

LITERAL = """\
import torch
g = torch.Generator().manual_seed(0)
lat = torch.randn(1, 4, 8, 8, generator=g, device="cuda")
print((lat * torch.ones(1, device="cuda")).device)
"""

LIKE_INPUT = """\
import torch
def noise_like(x, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(x.shape, generator=gen, device=x.device, dtype=x.dtype)
x = torch.zeros(2, 3, device="cuda")
print((x + noise_like(x, 1)).device)
"""


def _applied(tmp_path: Path, text: str) -> tuple[dict, str]:
    app = tmp_path / "app.py"
    app.write_text(text)
    doc = run_json(app, "cuda")
    subprocess.run(["git", "init", "-q", "."], cwd=tmp_path, check=True)
    (tmp_path / "p.diff").write_text(doc["patch"])
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True)
    again = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", "app.py"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    return doc, again.stdout + again.stderr


def test_the_draw_is_made_on_the_generator_and_moved(tmp_path: Path) -> None:
    doc, again = _applied(tmp_path, LITERAL)
    (fix,) = doc["fixes"]
    assert fix["code"].startswith("# app.py:3: torch.randn draws from a generator on cpu: draw on the generator's "
                                  "device and move the draw to cuda:0"), fix
    assert "+lat = torch.randn(1, 4, 8, 8, generator=g, device=g.device).to('cuda')" in doc["patch"], doc["patch"]
    assert "no placement error" in again and "cuda:0" in again, again


def test_a_device_read_from_the_input_is_where_the_draw_goes(tmp_path: Path) -> None:
    doc, again = _applied(tmp_path, LIKE_INPUT)
    assert "+    return torch.rand(x.shape, generator=gen, device=gen.device, dtype=x.dtype).to(x.device)" in doc["patch"]
    assert "no placement error" in again, again
