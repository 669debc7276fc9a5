"""``torchdoctor run --device xpu|mps`` of a program that asks for ``cuda`` (diffusers on an Intel GPU, a CUDA
script on a Mac): the virtual machine raises as such a build does, and the fix is the machine's own device, never
another torch build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from run.test_run_cli import run, write

APP = """\
    import torch
    t = torch.ones(3).to("cuda")
    print(t.device)
"""


@pytest.mark.parametrize("kind", ["xpu", "mps"])
def test_cuda_asked_on_another_machine_is_fixed_with_its_own_device(tmp_path: Path, kind: str) -> None:
    script = write(tmp_path / "app.py", APP)
    proc = run("--device", kind, "--json", str(script), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    doc = json.loads(proc.stdout[proc.stdout.index('{\n  "schema"'):])
    (finding,) = doc["findings"]
    assert finding["category"] == "no_accelerator" and "not compiled with CUDA" in finding["error"]
    assert finding["fix"].startswith(f"device = torch.accelerator.current_accelerator()  # {kind} on this machine")
    assert "app.py:2" in finding["fix"] and "pip install" not in finding["fix"], finding["fix"]
