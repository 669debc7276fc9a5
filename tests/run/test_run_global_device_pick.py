"""``torchdoctor run --device xpu`` (or mps) of a script whose own module-level pick is CUDA-only
(``device = "cuda" if torch.cuda.is_available() else "cpu"``) and moves the whole model with it (hunt A3: unsloth
#9524 on an Intel GPU): the pick is the fix, as a patch, proven; never a hard-coded ``'xpu:0'`` move after it. The
patched script runs clean on xpu, mps and cuda alike."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

APP = '''import torch, torch.nn as nn
device = "cuda" if torch.cuda.is_available() else "cpu"
net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).to(device{dtype})
batch = torch.randn(4, 8, device=torch.accelerator.current_accelerator())
print(net(batch).sum().item())
'''
PICK = 'device = torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"'


def _run(cwd: Path, device: str) -> str:
    r = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", device, "app.py"], cwd=cwd,
                       capture_output=True, text=True, timeout=300)
    return r.stdout + r.stderr


@pytest.mark.parametrize("dtype", ["", ", torch.float32"])
def test_a_cuda_only_pick_of_the_script_is_fixed_where_it_is_picked(tmp_path: Path, dtype: str) -> None:
    (tmp_path / "app.py").write_text(APP.format(dtype=dtype))
    out = _run(tmp_path, "xpu")
    assert 'moves its component to device = "cuda" if torch.cuda.is_available() else "cpu" (app.py:2), which is ' \
           "cpu here while the run is on xpu:0" in out, out
    assert "# fix proven" in out and "torchdoctor.move(net, 'xpu:0')" not in out, out
    patch = out.split("Patch (git apply):\n", 1)[1]
    diff = "\n".join(line[4:] for line in patch.splitlines() if line.startswith("    ")) + "\n"
    assert f"+{PICK}" in diff, diff
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "p.diff").write_text(diff)
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True, timeout=60)
    for device in ("xpu", "mps", "cuda"):
        assert "no placement error" in _run(tmp_path, device), device
