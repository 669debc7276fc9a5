"""An operand a forward made in the dtype of the caller's own argument (a timestep embedding that returns in
``t.dtype``, fed ``t = torch.from_numpy(sigmas * 1000)``: float64 into a bf16 model, WanTraining #10): strict, fix
and warn name the argument as the caller passed it, the line of the caller's code that made it, and the fix at that
line as explain does after the error — proven by a whole-forward re-run, with a patch — never only
``# pass arg 1 (mat1) as tensor.to(torch.bfloat16)``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

APP = '''import sys, warnings
import numpy as np
import torch
import torch.nn as nn
import torchdoctor


def embed(t, dim=8):
    freqs = torch.arange(dim // 2, device=t.device) / dim
    args = t.float()[:, None] * freqs[None]
    return torch.cat([args.cos(), args.sin()], dim=-1).to(t.dtype)  # in the timesteps' dtype


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.time = nn.Linear(8, 8)
        self.out = nn.Linear(8, 4)

    def forward(self, x, t):
        return self.out(x + self.time(embed(t)))


model = Net().to(torch.bfloat16)
x = torch.randn(2, 8, dtype=torch.bfloat16)
t = {maker}
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    g = torchdoctor.guard(model, mode=sys.argv[1])
    try:
        with g:
            model(x, t)
    except torchdoctor.PlacementError as e:
        print(e)
    print(g.report())
for w in seen:
    print("WARNING", w.message)
'''


def _run(tmp_path: Path, maker: str, mode: str) -> str:
    (tmp_path / "app.py").write_text(APP.format(maker=maker))
    r = subprocess.run([sys.executable, "app.py", mode], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    return r.stdout + r.stderr


def test_strict_names_the_argument_its_maker_and_fixes_that_line(tmp_path: Path) -> None:
    out = _run(tmp_path, "torch.from_numpy(np.array([0.5, 0.25]) * 1000)", "strict")
    assert "culprit t (an argument of the Net call): f64[2]@cpu  (expected bfloat16)" in out, out
    assert "t made by `torch.from_numpy` at " in out and "app.py:26 (`t = torch.from_numpy(" in out, out
    assert "fix proven: the whole forward runs again on a copy of the model with t -> bfloat16" in out, out
    assert "t = torch.from_numpy(np.array([0.5, 0.25]) * 1000).to(torch.bfloat16)  # app.py:26" in out, out
    assert "+t = torch.from_numpy(np.array([0.5, 0.25]) * 1000).to(torch.bfloat16)" in out, out
    assert "# pass arg 1 (mat1)" not in out, out


@pytest.mark.parametrize("mode", ["warn", "fix"])
def test_warn_and_fix_aim_at_the_same_line_for_another_maker(tmp_path: Path, mode: str) -> None:
    out = _run(tmp_path, "torch.as_tensor(np.linspace(0, 1, 2))", mode)
    assert "t made by `torch.as_tensor` at " in out, out
    assert "t = torch.as_tensor(np.linspace(0, 1, 2), dtype=torch.bfloat16)  # app.py:26" in out, out
    assert "# pass arg 1 (mat1)" not in out, out


COLLATED = '''import sys
import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import default_collate
import torchdoctor

model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).to(torch.bfloat16)
batch = default_collate([np.ones(8, dtype=np.float32), np.zeros(8, dtype=np.float32)])
try:
    with torchdoctor.guard(model, mode=sys.argv[1]):
        model(batch)
except torchdoctor.PlacementError as e:
    print(e)
'''


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_an_argument_a_library_call_made_is_fixed_at_the_program_s_line(tmp_path: Path, mode: str) -> None:
    # the tensor is made inside torch's default_collate: its maker is the program's line that got it
    (tmp_path / "app.py").write_text(COLLATED)
    r = subprocess.run([sys.executable, "app.py", mode], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert "input made by `default_collate(...)` at " in out and "app.py:9 (`batch = default_collate(" in out, out
    assert out.count("culprit input (an argument of the Sequential call)") == 1, out
    assert "fix proven: the whole forward runs again on a copy of the model with input -> bfloat16" in out, out
    assert "batch = default_collate([np.ones(8, dtype=np.float32), np.zeros(8, dtype=np.float32)]).to(" \
           "torch.bfloat16)  # app.py:9" in out, out
    assert "+batch = default_collate(" in out and "# pass input as" not in out, out
