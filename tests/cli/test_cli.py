"""The command line: TARGET resolution, exit codes, JSON, human output (snapshot of the stable lines)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchdoctor._cli.main import main

MODEL_FILE = textwrap.dedent(
    """
    import torch
    from torch import nn

    def broken():
        m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        m[1].bias.data = m[1].bias.data.double()
        return m

    def fine():
        return nn.Sequential(nn.Linear(4, 4))

    def with_inputs():
        return (nn.Linear(4, 4), (torch.ones(1, 4),))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

    instance = nn.Linear(3, 3)

    def explodes():
        raise ValueError("no model today")
    """
)


@pytest.fixture()
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "models.py"
    path.write_text(MODEL_FILE)
    return path


def test_scan_file_target_text(model_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", f"{model_file}:broken"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"1 problem(s) in {model_file}:broken:"
    assert out[1].split() [:2] == ["dtype", "1.bias"]
    assert "f64[4]@cpu is float64 but the model is float32" in out[1]


def test_scan_json(model_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", f"{model_file}:broken", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "torchdoctor/scan/1" and doc["ok"] is False
    assert [(p["kind"], p["path"], p["found"], p["expected"]) for p in doc["problems"]] == [
        ("dtype", "1.bias", "float64", "float32")]
    assert {"path", "role", "device", "dtype", "shape"} <= set(doc["tensors"][0])


@pytest.mark.parametrize("name", ["fine", "Net", "instance", "with_inputs"])
def test_scan_ok_targets_exit_0(model_file: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", f"{model_file}:{name}"]) == 0
    assert capsys.readouterr().out.startswith("ok: no placement problems")


def test_scan_with_expectation(model_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", f"{model_file}:fine", "--dtype", "bf16"]) == 1
    assert "expected bfloat16" not in capsys.readouterr().err


def test_module_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", "torch.nn:Linear"]) == 2  # Linear() needs arguments: a usage error, not a traceback
    assert "calling torch.nn:Linear with no arguments failed" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["scan", "nothing_here"], "is neither an existing file or directory nor"),
        (["scan", "missing.py:m"], "no such file"),
        (["scan", "no_such_pkg_xyz:m"], "cannot import module 'no_such_pkg_xyz'"),
        (["scan", "{file}:nope"], "has no attribute 'nope'"),
        (["scan", "{file}:explodes"], "ValueError: no model today"),
        (["scan", "{file}:fine", "--dtype", "bf17"], "not a dtype: 'bf17'"),
        (["scan", "{file}:fine", "--device", "gpu"], "not a device: 'gpu'"),
        (["scan", "{file}:fine", "--plan"], "--plan needs --device and/or --dtype"),
    ],
)
def test_usage_errors_exit_2_with_one_line(model_file: Path, argv: list[str], fragment: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a.replace("{file}", str(model_file)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    own = [line for line in err.strip().splitlines() if line.startswith("torchdoctor")]  # not a library's log
    assert "Traceback" not in err and len(own) == 1 and fragment in own[0]


def test_console_script_and_python_m(model_file: Path) -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    script = Path(sys.executable).with_name("torchdoctor")
    for cmd in ([str(script)], [sys.executable, "-m", "torchdoctor"]):
        out = subprocess.run([*cmd, "scan", f"{model_file}:broken", "--json"], capture_output=True, text=True,
                             env=env, timeout=120)
        assert out.returncode == 1, out.stderr
        assert json.loads(out.stdout)["problems"][0]["path"] == "1.bias"


def test_no_verb_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "scan" in capsys.readouterr().out
