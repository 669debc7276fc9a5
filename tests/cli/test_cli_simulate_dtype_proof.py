"""``torchdoctor simulate app.py:target --device mps`` and ``simulate()`` give one verdict on a fix that switches the
model's dtype: a float64 buffer (a scheduler's table made with numpy) cannot go to mps, ``model.to(torch.float32)``
fixes it, and both prove it by a re-run asking float32 (the command line's re-run builds the TARGET again)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.apps import app_folder, load_file
from torchdoctor._cli.main import main

APP = """
import numpy as np
import torch
from torch import nn
import torchdoctor

class Sched(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        betas = np.linspace(1e-4, 0.02, 10)
        self.register_buffer("alphas", torch.from_numpy(np.cumprod(1 - betas)))

    def forward(self, x, t=3):
        return self.lin(x) * self.alphas[t]

def target():
    return torchdoctor.Target(Sched(), (torch.randn(2, 4),))
"""


@pytest.fixture()
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return app_folder(tmp_path, monkeypatch, "schedapp.py", APP)


def _verdicts(fixes: list[dict]) -> list[tuple[str, bool]]:
    return [(f["code"].split("  #")[0], f["proven"]) for f in fixes]


def test_a_dtype_switch_for_mps_is_proven_by_the_command_line_as_by_the_api(
        app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torchdoctor

    code = main(["simulate", "schedapp.py:target", "--device", "mps", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [(p["kind"], p["path"]) for p in doc["problems"]] == [("unsupported_dtype", "alphas")]
    assert _verdicts(doc["fixes"]) == [("model.to(torch.float32)", True)], doc["fixes"]
    assert "asking float32" in doc["fixes"][0]["tried"] and "still found" not in doc["fixes"][0]["tried"]

    t = load_file(app / "schedapp.py").target()  # the same program through the API: the same fix, the same verdict
    report = torchdoctor.simulate(t.obj, tuple(t.args), device="mps")
    assert _verdicts(report.to_dict()["fixes"]) == _verdicts(doc["fixes"])
