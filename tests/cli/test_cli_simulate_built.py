"""``torchdoctor simulate app.py:build_target --device D`` where the TARGET's own code placed its model on the
virtual device: its placement is checked as built (issue 42 point 2). Inputs it left on the CPU and quantization
state a hand-made move left behind are problems, as the API with call= and the pytest marker say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchdoctor._cli.main import main
from support.apps import app_folder

APP = """
import torch
from torch import nn
import torchdoctor

class Tok(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(16, 4)

    def forward(self, ids):
        return self.wte(ids)

def ids_left_on_cpu():
    m = Tok().to("mps")
    return torchdoctor.Target(m, (torch.tensor([[1, 2, 3]]),))  # tokenizer output, never moved

def placed_right():
    m = Tok().to("mps")
    return torchdoctor.Target(m, (torch.tensor([[1, 2, 3]], device="mps"),))

def left_for_simulate():
    return torchdoctor.Target(Tok(), (torch.tensor([[1, 2, 3]]),))  # simulate places model and inputs

def quant_state_left():
    import bitsandbytes as bnb
    m = nn.Sequential(bnb.nn.Linear4bit(64, 64, compute_dtype=torch.bfloat16, quant_type="nf4"))
    m.to("cpu")  # quantizes on cpu
    for p in m.parameters():
        p.data = p.data.to("cuda:0")  # quant_state stays behind
    return torchdoctor.Target(m, (torch.randn(2, 64, dtype=torch.bfloat16, device="cuda:0"),))
"""


@pytest.fixture()
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return app_folder(tmp_path, monkeypatch, "builtapp.py", APP)


def _run(capsys: pytest.CaptureFixture[str], spec: str, device: str) -> tuple[int, dict]:
    code = main(["simulate", f"builtapp.py:{spec}", "--device", device, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_inputs_the_target_left_on_cpu_are_a_problem(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = _run(capsys, "ids_left_on_cpu", "mps")
    assert code == 1
    assert [(p["kind"], p["path"], p["found"]) for p in doc["problems"]] == [("device", "input 0", "cpu")]


def test_a_target_placed_right_is_ok(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = _run(capsys, "placed_right", "mps")
    assert code == 0 and doc["problems"] == []


def test_a_target_on_the_cpu_is_still_placed_by_simulate(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = _run(capsys, "left_for_simulate", "mps")
    assert code == 0 and doc["problems"] == []


def test_quant_state_a_hand_move_left_behind(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = _run(capsys, "quant_state_left", "cuda:0")
    assert code == 1
    paths = {p["path"] for p in doc["problems"] if p["kind"] == "device"}
    assert "0.weight.quant_state.absmax" in paths, paths


def test_nothing_to_check_is_the_same_answer_from_the_api_and_the_command_line(
        app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torchdoctor

    report = torchdoctor.simulate(42, device="cuda:1")
    assert report.nothing_to_check and report.exit_code() == 2
    assert report.to_dict()["nothing_to_check"] is True
    assert report.text().startswith("nothing to check: no tensors and no tensor op (0 ops on virtual cuda:1")
    Path("builtapp.py").write_text(APP + "\nanswer = 42\n")
    assert main(["simulate", "builtapp.py:answer", "--device", "cuda:1"]) == 2
    assert "nothing to check" in capsys.readouterr().err


def test_the_time_to_build_the_target_is_said_apart(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Path("builtapp.py").write_text(APP + "\nimport time\n\ndef slow():\n    time.sleep(0.5)\n    return placed_right()\n")
    code, doc = _run(capsys, "slow", "mps")
    assert code == 0 and doc["built_seconds"] >= 0.5  # the sleep is in the build, said apart
    assert main(["simulate", "builtapp.py:slow", "--device", "mps"]) == 0
    out = capsys.readouterr().out
    assert "ops on virtual mps:0, built in 0." in out and "s; simulated in " in out, out


def test_the_api_says_no_build_time() -> None:
    import torch
    import torchdoctor

    report = torchdoctor.simulate(torch.nn.Linear(2, 2), (torch.ones(1, 2),), device="mps")
    assert report.built_seconds is None and report.to_dict()["built_seconds"] is None
    assert "built in" not in report.text() and not report.nothing_to_check


def test_a_factory_fix_names_the_tensor_in_scope_at_its_line(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Path("builtapp.py").write_text(APP + '''
class Codec(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(32, 8)
        self.pos = nn.Embedding(16, 8)

    def forward(self, codes):
        positions = torch.arange(codes.shape[1])  # on cpu
        return self.tok(codes) + torch.index_select(self.pos.weight, 0, positions)[None]

def codec():
    return torchdoctor.Target(Codec().to("cuda:0"), (torch.tensor([[1, 2, 3]], device="cuda:0"),))
''')
    code, doc = _run(capsys, "codec", "cuda:0")
    assert code == 1
    assert [(f["code"], f["proven"]) for f in doc["fixes"]] == [
        ("# torch.arange in `<root>` made it on cpu: pass device= the input's device (torch.arange(..., "
         "device=codes.device))", True)]
