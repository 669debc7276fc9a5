"""Conditioning parked on the cpu and joined there (``both = torch.cat([uncond, cond])``, InvokeAI #8850) is handed
to a model on the device: ``run`` fixes it at the join's own line, ``.to(x.device)`` on the result, with a patch
that applied leaves the run clean (the argument's maker is a ``Tensor.`` op at the program's line)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.apps import run_json

APP = '''import torch
from torch import nn

lin = nn.Linear(8, 8).to("cuda")


def encode(seed):
    return torch.randn(1, 8).to("cpu")  # parked on the cpu between steps


def step(x, uncond, cond):
    both = torch.cat([uncond, cond])
    return lin(both) + x


x = torch.zeros(2, 8, device="cuda")
print(step(x, encode(0), encode(1)).shape)
'''


def test_a_cpu_join_handed_to_the_model_is_fixed_at_its_line(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(APP)
    doc = run_json(app, "cuda")
    assert not doc["ok"]
    [fix] = doc["fixes"]
    assert "made by cat at app.py:12" in fix["code"] and "torch.cat([uncond, cond]).to(x.device)" in fix["code"]
    assert fix["proven"] is True
    patch = doc["patch"]
    assert "+    both = torch.cat([uncond, cond]).to(x.device)" in patch
    subprocess.run(["git", "apply", "-"], input=patch, cwd=tmp_path, text=True, check=True, timeout=60)
    assert run_json(app, "cuda")["ok"]
