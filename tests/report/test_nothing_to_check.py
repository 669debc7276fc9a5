"""The API and the command line agree on "nothing to check" (issue 42 point 7): ``scan(42)`` in Python reads as
``torchdoctor scan`` of a TARGET holding no tensors (its words, its exit code 2 through ``exit_code()``), while
``ok`` still says nothing wrong was found."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import torchdoctor
from torchdoctor._cli.main import main


@pytest.mark.parametrize("obj", [42, {}, torch.nn.ReLU()], ids=["int", "empty-dict", "relu"])
def test_scan_of_an_object_without_tensors_says_nothing_to_check(obj: object) -> None:
    report = torchdoctor.scan(obj)
    name = type(obj).__name__
    assert report.ok and report.nothing_to_check and report.exit_code() == 2
    assert str(report).splitlines()[0] == (f"nothing to check: {name} holds no tensors; point scan at a model, a "
                                           "pipeline or a checkpoint")
    assert "ok: no placement problems" not in str(report)
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["nothing_to_check"] is True and doc["ok"] is True


def test_a_model_is_something_to_check() -> None:
    good = torchdoctor.scan(torch.nn.Linear(2, 2))
    assert not good.nothing_to_check and good.exit_code() == 0 and str(good).startswith("ok: no placement problems")
    bad = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    bad[1].bias.data = bad[1].bias.data.double()
    report = torchdoctor.scan(bad)
    assert not report.nothing_to_check and report.exit_code() == 1


def test_the_command_line_says_the_same_words(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "plain.py").write_text("answer = 42\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["scan", "plain.py:answer"]) == torchdoctor.scan(42).exit_code() == 2
    err = capsys.readouterr().err
    assert err.startswith("torchdoctor scan: nothing to check: plain.py:answer holds no tensors (a int)")
