"""A forward's own line casts a tensor already on the device to a dtype that device cannot hold (a rope's
``pos.to(torch.float64)`` on MPS, LongCat-Image #21): the fix is that line, written in a dtype the device holds, as a
patch, proven; never ``torchdoctor.move(model, 'mps:0')`` — the model is on mps:0 already, a move of it changes
nothing. The same in ``simulate`` (another verb) and for ``.double()`` (another spelling); a model already on the
device never gets a whole-model move as the last resort either."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import torch

import torchdoctor
from run.test_run_cli import run, write

ROPE = """
    import torch, torch.nn as nn


    class Rope(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            pos = torch.arange(x.shape[1], device=x.device)
            freqs = torch.arange(0, 8, 2, device=x.device, dtype=torch.float32) / 8
            angles = {cast}[:, None] * freqs
            return self.lin(x) * angles.cos().float().repeat(1, 2)


    dev = "mps" if torch.backends.mps.is_available() else "cuda" if torch.cuda.is_available() else "cpu"
    if __name__ == "__main__":
        model = Rope().to(dev)
        print("shape", tuple(model(torch.randn(2, 5, 8, device=dev)).shape))
"""


def _patch(out: str) -> str:
    patch = out.split("Patch (git apply):\n", 1)[1]
    return "\n".join(line[4:] for line in patch.splitlines() if line.startswith("    ")) + "\n"


def test_a_cast_to_float64_of_a_tensor_on_mps_is_fixed_at_its_line_never_a_move_of_the_model(tmp_path: Path) -> None:
    write(tmp_path / "rope.py", ROPE.format(cast="pos.to(torch.float64)"))
    proc = run("--device", "mps", "rope.py", cwd=tmp_path)
    out = proc.stdout + proc.stderr
    fix = out[out.index("\nFix"):]
    assert "rope.py:13: `angles = pos.to(torch.float64)[:, None] * freqs` casts to float64 on mps:0, which cannot " \
           "hold float64: cast to float32 there" in fix, out
    assert "# fix proven" in fix and "torchdoctor.move(model" not in fix, out
    diff = _patch(out)
    assert "+        angles = pos.to(torch.float32)[:, None] * freqs" in diff, diff
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "p.diff").write_text(diff)
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True, timeout=60)
    again = run("--device", "mps", "rope.py", cwd=tmp_path)
    said = again.stdout + again.stderr
    assert "no placement error" in said and "shape (2, 5, 8)" in said, said


def test_simulate_fixes_a_double_cast_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path / "rope_double.py", ROPE.format(cast="pos.double()"))
    spec = importlib.util.spec_from_file_location("rope_double", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    report = torchdoctor.simulate(mod.Rope(), (torch.randn(2, 5, 8),), "mps")
    assert report.fix is not None and "torchdoctor.move(" not in report.fix, report
    assert "`angles = pos.double()[:, None] * freqs` casts to float64 on mps:0" in report.fix, report.fix
    assert "+        angles = pos.to(torch.float32)[:, None] * freqs" in str(report), report


def test_no_whole_model_move_for_a_model_already_on_the_device(tmp_path: Path) -> None:
    # integer positions made on the cpu and moved as float64 by the forward's own line: whatever the fix is, it is
    # never a move of the model, which sits on mps:0 already
    write(tmp_path / "rope_moved.py", ROPE.format(cast="pos").replace(
        "torch.arange(x.shape[1], device=x.device)", "torch.arange(x.shape[1]).to(x.device, torch.float64)"))
    proc = run("--device", "mps", "rope_moved.py", cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert "moved to mps:0 as float64" in out, out
    fix = out[out.index("\nFix"):]
    assert "torchdoctor.move(model" not in fix, out
    assert "# no fix found: the model is on mps:0 already, so a move of it changes nothing" in fix or \
        "Patch (git apply)" in fix, out
