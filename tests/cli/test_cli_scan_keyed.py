"""``torchdoctor scan app.py:parts`` where the TARGET returns a dict of components (hunt U32: a model and its EMA):
the move that fixes a component is written as the object holds it, ``obj['model'].to('cuda:0')``, never
``model.model.to(...)`` (an attribute the dict does not have); a model TARGET keeps ``model.<path>``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchdoctor._cli.main import main
from support.apps import app_folder

APP = """
import torch
from torch import nn

def parts():
    return {"model": nn.Sequential(nn.Linear(4, 4)), "head": nn.Linear(4, 2)}

def model():
    return nn.Sequential(nn.Linear(4, 4))
"""


@pytest.fixture()
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return app_folder(tmp_path, monkeypatch, "keyedapp.py", APP)


def test_a_dict_of_components_gets_its_moves_by_key(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", "keyedapp.py:parts", "--device", "cuda:0", "--color", "never"]) == 1
    out = capsys.readouterr().out
    assert "->  obj['model'].to('cuda:0')" in out and "->  obj['head'].to('cuda:0')" in out
    assert "model.model" not in out
    assert main(["scan", "keyedapp.py:parts", "--device", "cuda:0", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert sorted(r["fix"] for r in doc["relocations"]) == ["obj['head'].to('cuda:0')", "obj['model'].to('cuda:0')"]


def test_a_model_target_keeps_its_attribute_paths(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", "keyedapp.py:model", "--device", "cuda:0", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [r["fix"] for r in doc["relocations"]] == ["model.to('cuda:0')"]
    assert "keyed" not in doc
