"""A model tensor the device cannot hold (a float64 numpy table moved to MPS) is one problem from the API and from
the command line, with or without inputs, and one fix (hunt W21): the placement check after the move no longer says
the same tensor again as "float64 but the model is float32"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import torchdoctor
from torchdoctor._cli.main import main
from support.apps import app_folder, load_file

APP = """
import numpy as np, torch, torch.nn as nn
import torchdoctor

class Sched(nn.Module):
    def __init__(s):
        super().__init__()
        s.lin = nn.Linear(4, 4)
        betas = np.linspace(1e-4, 0.02, 10)
        s.register_buffer("alphas", torch.from_numpy(np.cumprod(1 - betas)))
    def forward(s, x, t=3):
        return s.lin(x) * s.alphas[t]

class Gain(nn.Module):
    def __init__(s):
        super().__init__()
        s.lin = nn.Linear(4, 4)
        s.gain = nn.Parameter(torch.from_numpy(np.ones(4)))
    def forward(s, x):
        return s.lin(x) * s.gain.float()

def sched():
    return Sched()

def sched_target():
    return torchdoctor.Target(Sched(), (torch.randn(2, 4),))

def gain():
    return Gain()

def gain_target():
    return torchdoctor.Target(Gain(), (torch.randn(2, 4),))
"""


@pytest.fixture()
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return app_folder(tmp_path, monkeypatch, "refusedapp.py", APP)


def _cli(capsys: pytest.CaptureFixture[str], spec: str) -> dict:
    main(["simulate", f"refusedapp.py:{spec}", "--device", "mps", "--json"])
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("cls", "path"), [("Sched", "alphas"), ("Gain", "gain")])
def test_one_answer_from_the_api_and_the_command_line(app: Path, capsys: pytest.CaptureFixture[str], cls: str,
                                                      path: str) -> None:
    mod = load_file(app / "refusedapp.py")
    api = torchdoctor.simulate(getattr(mod, cls)(), (torch.randn(2, 4),), "mps")
    bare, given = _cli(capsys, cls.lower()), _cli(capsys, f"{cls.lower()}_target")
    want = [("unsupported_dtype", path)]
    assert [(p.kind, p.path) for p in api.problems] == want, api.text()
    for doc in (bare, given):
        assert [(p["kind"], p["path"]) for p in doc["problems"]] == want, doc["problems"]
        assert doc["fix"] == api.fix
    assert given["ops"] > 0 and bare["ops"] == 0  # a TARGET with no inputs only places its model
