"""Every expectation says where it came from (issue 27, point 6): a device set in ``[tool.torchdoctor]`` is
reported with the file (rule ``config`` in JSON), one given on the command line names the option."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchdoctor._cli.main import main

APP = """
from torch import nn

def model():
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    m.extra = [nn.Linear(2, 2)]
    return m
"""


@pytest.fixture()
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "pyproject.toml").write_text('[tool.torchdoctor]\ndevice = "cuda:0"\ndtype = "bfloat16"\n')
    (tmp_path / "app.py").write_text(APP)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_config_expectation_names_the_file(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pyproject = project / "pyproject.toml"
    assert main(["scan", "app.py:model", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    root = doc["expected"][""]
    assert root["device_rule"] == root["dtype_rule"] == "config"
    assert root["device_source"] == root["dtype_source"] == f"[tool.torchdoctor] in {pyproject}"
    assert not [p for p in doc["problems"] if "asked for" in p["message"] and "[tool.torchdoctor]" not in p["message"]]
    assert main(["scan", "app.py:model"]) == 1
    text = capsys.readouterr().out
    assert f"(device from [tool.torchdoctor] in {pyproject}; dtype from [tool.torchdoctor] in {pyproject})" in text


def test_command_line_expectation_names_the_option(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", "app.py:model", "--device", "cpu", "--json"]) == 1
    root = json.loads(capsys.readouterr().out)["expected"][""]
    assert (root["device_rule"], root["device_source"]) == ("explicit", "--device")
    assert root["dtype_rule"] == "config"  # the file still sets what the command line left out


SIM = """
import torch
from torch import nn

def target():
    m = nn.Sequential(nn.Linear(2, 2))
    m.extra = [nn.Linear(2, 2)]
    return m, (torch.ones(1, 2),)
"""


def test_simulate_says_where_device_dtype_and_profile_came_from(project: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    pyproject = project / "pyproject.toml"
    pyproject.write_text('[tool.torchdoctor]\ndevice = "cuda:1"\nprofile = "a100"\n')
    (project / "sim.py").write_text(SIM)
    assert main(["simulate", "sim.py:target", "--dtype", "float16", "--json"]) == 1
    e = json.loads(capsys.readouterr().out)["expected"]
    assert (e["device"], e["device_source"]) == ("cuda:1", f"[tool.torchdoctor] in {pyproject}")
    assert (e["dtype"], e["dtype_source"]) == ("float16", "--dtype")
    assert e["profile_source"] == f"[tool.torchdoctor] in {pyproject}" and "A100" in e["profile"]
    assert main(["simulate", "sim.py:target", "--dtype", "float16"]) == 1
    text = capsys.readouterr().out
    assert f"(device from [tool.torchdoctor] in {pyproject}; dtype from --dtype; profile from " in text
    pyproject.write_text("")
    assert main(["simulate", "sim.py:target", "--profile", "t4", "--json"]) == 1
    e = json.loads(capsys.readouterr().out)["expected"]
    assert e["device_source"] == "the profile (--profile)" and e["profile_source"] == "--profile"
    assert main(["simulate", "sim.py:target", "--device", "cuda:0", "--json"]) == 1
    e = json.loads(capsys.readouterr().out)["expected"]
    assert e["profile_source"] == "the default profile of cuda" and "dtype" not in e
