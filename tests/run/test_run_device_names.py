"""A fix at a factory's line reads the device from where the program has it at that line, never a device written out
(hunt of the twenty-fifth session, round two).

- A forward that moves its own input a line after making a mask from it (``mask = torch.ones(h.shape[0], 1)``,
  then ``h = h.to(self.lin.weight.device)``): ``h`` is still on the cpu at the mask's line, so ``device=h.device``
  would change nothing; the fix reads the module's own parameters' device there, and applied, the run is clean.
- A trainer that picks ``device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")`` and makes a mask
  with no device: ``device=device``, never ``device='cuda:0'`` (which would crash its own cpu fallback); applied,
  the program runs on this cpu and the virtual run is clean.
- A module-level mask met by a model's output at ``y = h * attn``: made with the program's own ``device`` at its
  factory, not with a literal device.
- A learnable tensor ``accelerator.prepare`` leaves where it is (accelerate #3157): made with
  ``device=accelerator.device``, the program's own name for its device (hunt of the twenty-sixth session, p03).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from run.test_run_cli import ENV, TIMEOUT, run, write

SELF_MOVE = """
    import torch, torch.nn as nn

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 4)

        def forward(self, h):
            mask = torch.ones(h.shape[0], 1)
            h = h.to(self.lin.weight.device)
            return self.lin(h) * mask

    head = Head().to("cuda:0")
    print("done", tuple(head(torch.randn(3, 16)).shape))
"""

FALLBACK = """
    import torch, torch.nn as nn
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Embedding(50, 32), nn.Linear(32, 50)).to(device)
    for step in range(2):
        ids = torch.randint(0, 50, (2, 8)).to(device)
        attn = torch.ones(2, 8)  # no device
        logits = model(ids) * attn.unsqueeze(-1)
        logits.sum().backward()
    print("done")
"""

USE_LINE = """
    import torch, torch.nn as nn
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Linear(8, 8).to(device)
    x = torch.randn(2, 8).to(device)
    attn = torch.ones(2, 8)
    h = model(x)
    y = h * attn
    print("done")
"""


ACCELERATOR = """
    import torch
    from accelerate import Accelerator
    accelerator = Accelerator()
    w = torch.zeros((1, 1), requires_grad=True)
    x = torch.ones(2, 1, device=accelerator.device)
    print("done", (x @ w).shape)
"""


def _fixed_run(tmp_path: Path, text: str, want: str, here: bool = True) -> None:
    app = write(tmp_path / "app.py", text)
    proc = run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path)
    report = json.loads(proc.stdout[proc.stdout.index("\n{") + 1:])
    assert any(want in f["code"] for f in report["fixes"]), report["fixes"]
    assert "'cuda:0'" not in report["patch"].split("\n+", 1)[1], report["patch"]
    subprocess.run(["git", "apply", "-"], input=report["patch"], cwd=tmp_path, text=True, check=True, timeout=60)
    again = run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path)
    assert json.loads(again.stdout[again.stdout.index("\n{") + 1:])["ok"], again.stdout[-3000:]
    if here:  # the program's own cpu fallback still runs
        real = subprocess.run([sys.executable, str(app)], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                              timeout=TIMEOUT)
        assert real.returncode == 0, real.stderr[-2000:]


def test_a_mask_made_before_the_forward_moves_its_input_reads_the_modules_device(tmp_path: Path) -> None:
    _fixed_run(tmp_path, SELF_MOVE, "torch.ones(..., device=next(self.parameters()).device)", here=False)


def test_a_trainers_mask_is_made_with_the_programs_own_device_name(tmp_path: Path) -> None:
    _fixed_run(tmp_path, FALLBACK, "torch.ones(..., device=device)")


def test_a_module_level_mask_is_moved_where_it_meets_the_models_output(tmp_path: Path) -> None:
    _fixed_run(tmp_path, USE_LINE, "torch.ones(..., device=device)")


def test_a_tensor_accelerate_leaves_behind_is_made_on_the_accelerators_device(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    _fixed_run(tmp_path, ACCELERATOR, "torch.zeros(..., device=accelerator.device)")
