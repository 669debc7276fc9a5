"""``torchdoctor simulate app.py:model --device cpu --dtype float16`` runs the API's CPU dtype check (issue 41
point 6, the command line): ops with no kernel in the dtype are named by path; without --dtype, one line that
names the option."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import torchdoctor
from torchdoctor._cli.main import main
from support.apps import app_folder

APP = """
import torch
from torch import nn

def fine():
    return nn.Sequential(nn.Linear(4, 4)), (torch.ones(1, 4),)

class Upcast(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = torch.ones(4, dtype=torch.float32)  # promotes a float16 forward to float32

    def forward(self, x):
        return self.lin(x) * self.scale

def upcast():
    return Upcast(), (torch.ones(1, 4),)
"""


@pytest.fixture()
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return app_folder(tmp_path, monkeypatch, "cpuapp.py", APP)


def test_cpu_dtype_check_from_the_command_line(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "cpuapp.py:fine", "--device", "cpu", "--dtype", "float16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok: no placement problems") and "on cpu in float16" in out and "virtual" not in out


def test_cli_and_api_agree_on_a_silent_promotion(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import cpuapp  # type: ignore[import-not-found]

    obj, inputs = cpuapp.upcast()
    api = torchdoctor.simulate(obj, inputs, device="cpu", dtype="float16")
    code = main(["simulate", "cpuapp.py:upcast", "--device", "cpu", "--dtype", "float16", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == api.exit_code() == 1
    assert [(p["kind"], p["path"]) for p in doc["problems"]] == [(p.kind, p.path) for p in api.problems]
    assert any(p["path"] == "scale" for p in doc["problems"])
    # where device and dtype came from: the options, as every other CLI simulate says (the API says device=)
    assert (doc["expected"]["device_source"], doc["expected"]["dtype_source"]) == ("--device", "--dtype")
    assert api.expected["device_source"] == "the device= argument"
    assert main(["simulate", "cpuapp.py:upcast", "--device", "cpu", "--dtype", "float16", "--color", "never"]) == 1
    text = capsys.readouterr().out
    assert "(device from --device; dtype from --dtype;" in text and "argument" not in text


def test_cpu_without_a_dtype_names_the_option(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "cpuapp.py:fine", "--device", "cpu"]) == 2
    assert capsys.readouterr().err == ("torchdoctor simulate: --device cpu checks a dtype on this CPU: add --dtype "
                                       "(e.g. --dtype float16), or pick a virtual device (--device cuda:1, xpu, "
                                       "mps)\n")


def test_a_model_without_inputs_is_never_said_to_hold_no_tensors(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A factory that returns a bare module: on the CPU the dtype is checked by running it, and nothing ran; the
    line says what to return instead, never "holds no tensors" (it holds three)."""
    Path("cpuapp.py").write_text(APP + "\ndef bare():\n    return Upcast()\n\nanswer = 42\n")
    assert main(["simulate", "cpuapp.py:bare", "--device", "cpu", "--dtype", "float16"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("torchdoctor simulate: cpuapp.py:bare returned a Upcast module but no inputs, so no forward ran on "
                   "this cpu (a dtype on the CPU is checked by running the model): return torchdoctor.Target(model, "
                   "(x,)) from it with an input x, as the README's `torchdoctor simulate my_app.py:build_target` does")
    assert main(["simulate", "cpuapp.py:answer", "--device", "cpu", "--dtype", "float16"]) == 2
    assert "nothing to check: cpuapp.py:answer holds no tensors and ran no tensor op (a int)" in capsys.readouterr().err
