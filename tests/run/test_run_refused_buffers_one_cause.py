"""numpy float64 statistics registered as buffers with ``torch.from_numpy`` in a model's ``__init__``, then
``model.to("mps")`` (CAREamics/MicroSplit-reproducibility #24): mps cannot hold float64, so the move raises. The run
names each buffer's maker line, says the buffers as one cause (one move refused them), drops the silent promotions
the run met after (the buffers never compute on mps in float64), and patches each maker line, proven by the
program running clean after the patch."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import numpy as np

import torchdoctor
from support.apps import committed, run_json

APP = """
    import numpy as np, torch, torch.nn as nn

    stats = {"mean": np.array([100.0]), "std": np.array([20.0])}

    class Norm(nn.Module):
        def __init__(self, stats):
            super().__init__()
            self.register_buffer("mean", torch.from_numpy(stats["mean"]).view(1, -1))
            self.register_buffer("std", torch.from_numpy(stats["std"]).view(1, -1))
            self.lin = nn.Linear(1, 2)

        def forward(self, x):
            return self.lin(((x - self.mean) / self.std).float())

    model = Norm(stats).to("mps")
    print(model(torch.randn(4, 1, device="mps")).shape)
"""


def test_run_names_both_makers_as_one_cause_and_patches_them(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent(APP))
    committed(tmp_path)
    doc = run_json(app, "mps")
    kinds = [p["kind"] for p in doc["problems"]]
    assert kinds == ["unsupported_dtype", "unsupported_dtype"], doc["problems"]  # no "promotes silently" after
    [cause] = doc["causes"]
    assert "made by torch.from_numpy at app.py:9" in cause["message"], cause
    assert "made by torch.from_numpy at app.py:10" in cause["message"], cause
    patch = doc["patch"] or ""
    assert '+        self.register_buffer("mean", torch.from_numpy(stats["mean"]).to(torch.float32).view(1, -1))' in patch
    assert '+        self.register_buffer("std", torch.from_numpy(stats["std"]).to(torch.float32).view(1, -1))' in patch
    (tmp_path / "fix.diff").write_text(patch)
    subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, check=True, timeout=60)
    assert not run_json(app, "mps")["problems"]


class _Built(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.from_numpy(np.array([1.0])))
        self.lin = nn.Linear(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x - self.mean)


def test_a_block_that_builds_and_moves_the_model_names_the_maker_too() -> None:
    with torchdoctor.virtual_devices("mps", raise_on_exit=False) as sim:
        model = _Built().to("mps")
        model(torch.randn(3, 1, device="mps"))
    assert [p.kind for p in sim.problems] == ["unsupported_dtype"], sim.problems
    assert "(made by torch.from_numpy at " in sim.problems[0].message, sim.problems[0].message


@pytest.mark.parametrize("device", ["cuda"])
def test_a_device_that_holds_float64_keeps_the_promotion(device: str) -> None:
    with torchdoctor.virtual_devices(device, raise_on_exit=False) as sim:
        model = _Built().to(device)
        model(torch.randn(3, 1, device=device))
    assert sim.problems and all(p.kind != "unsupported_dtype" for p in sim.problems), sim.problems
