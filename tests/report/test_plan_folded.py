"""``scan --plan`` leads with what ``Module.to`` would miss, then folds the parameters by module (issue 42 point
10): a list-held layer and a plain attribute are never lost behind "... and N more" parameter rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from torchdoctor._cli.main import main
from torchdoctor._move.plan import plan
from torchdoctor._report.folded import fold_plan
from support.apps import app_folder

APP = """
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(8, 8)
        self.mlp = nn.Linear(8, 8)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(30))
        self.norm = nn.LayerNorm(8)
        self.extra = [nn.Linear(8, 8)]  # list-held: Module.to never sees it
        self.mask = torch.ones(8)  # a plain attribute

def model():
    return Net()
"""


@pytest.fixture()
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return app_folder(tmp_path, monkeypatch, "planapp.py", APP)


def test_plan_text_leads_with_what_module_to_misses_then_folds(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", "planapp.py:model", "--plan", "--device", "cuda:0", "--dtype", "bfloat16"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[:5] == [
        "125 tensor(s) would move:",
        "3 that Module.to would miss (move handles them):",
        "  mask  f32[8]@cpu -> bf16[8]@cuda:0  (attribute)",
        "  extra.0.weight  f32[8,8]@cpu -> bf16[8,8]@cuda:0  (parameter)",
        "  extra.0.bias  f32[8]@cpu -> bf16[8]@cuda:0  (parameter)",
    ]
    assert lines[5:] == ["122 that Module.to would move too, by module:",
                         "  layers.0-29  120 tensor(s)  f32@cpu -> bf16@cuda:0",
                         "  norm  2 tensor(s)  f32@cpu -> bf16@cuda:0"]
    assert not any("more" in line for line in lines)  # 122 rows folded into 2, nothing hidden


def test_plan_json_names_what_module_to_misses(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", "planapp.py:model", "--plan", "--device", "cuda:0", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["missed_by_module_to"] == ["mask", "extra.0.weight", "extra.0.bias"]
    assert len(doc["plan"]) == 125 and set(doc["plan"][0]) == {"path", "role", "found", "expected", "via"}


def test_fold_says_when_a_module_holds_several_changes() -> None:
    m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    m[1].bias.data = m[1].bias.data.double()
    steps = plan(m, device="cuda:0", dtype="float16")
    assert not any(s.missed_by_module_to for s in steps)
    assert fold_plan(steps) == ["4 that Module.to would move too:", *(f"  {s}" for s in steps)]  # fits: whole
    # past the limit, numbered blocks fold into one range; a float64 bias among float32 weights is a second change
    assert fold_plan(steps, limit=3) == ["4 that Module.to would move too, by module:",
                                         "  0-1  4 tensor(s)  2 kinds of change"]
