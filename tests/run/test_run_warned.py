"""A warning that says the program silently runs otherwise than it asked is a finding: ``torch.autocast("cuda")``
hard-coded in a trainer, run on a machine whose device is an Intel GPU, is disabled with one warning and the step
runs in float32 (gazingstars123/Anima-Standalone-Trainer #38). ``run`` names the line and writes the autocast with
the machine's own device type, by the name the program holds the device; the patch, applied, runs in bfloat16."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

APP = '''import torch, torch.nn as nn
dev = torch.accelerator.current_accelerator()
model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16)).to(dev)
x = torch.randn(8, 16, device=dev)
with torch.autocast("cuda", dtype=torch.bfloat16):
    y = model(x)
print("computed in", y.dtype)
'''


def _run(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "xpu", "--json", "app.py"],
                          cwd=folder, capture_output=True, text=True, timeout=300)


def test_autocast_for_cuda_on_an_xpu_machine_is_a_finding_whose_patch_runs_in_bfloat16(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(APP)
    proc = _run(tmp_path)
    assert "Disabling autocast" in proc.stderr  # the program's own warning is still shown as python shows it
    assert "computed in torch.float32" in proc.stdout
    doc = json.loads(proc.stdout[proc.stdout.index('{\n  "schema"'):])
    [finding] = doc["findings"]
    assert finding["category"] == "autocast_disabled" and finding["where"] == "app.py:5 in <module>"
    assert finding["fix"].splitlines()[0].startswith("with torch.autocast(dev.type, dtype=torch.bfloat16):")
    assert "checked: torch.autocast('xpu', dtype=torch.bfloat16) stays enabled" in finding["fix"]
    subprocess.run(["git", "init", "-q", "."], cwd=tmp_path, check=True)
    subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=finding["diff"], text=True, check=True)
    again = _run(tmp_path)
    assert "computed in torch.bfloat16" in again.stdout
    assert json.loads(again.stdout[again.stdout.index('{\n  "schema"'):])["findings"] == []
