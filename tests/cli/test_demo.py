"""``torchdoctor demo`` (what ``make demo`` runs): every step finds exactly the planted bugs and the fix holds."""

from __future__ import annotations

import json

import pytest

from torchdoctor._cli import demo as _demo

LORA_B = f"{_demo.ADAPTER_LAYER}.lora_B.default.weight"


def test_demo_steps(capsys: pytest.CaptureFixture[str]) -> None:
    assert _demo.run(as_json=True) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "torchdoctor/demo/1" and doc["ok"] is True
    assert sorted(doc["scan"]) == sorted([LORA_B, "latent_scale", "refiners.0.bias", "refiners.0.weight"])
    assert doc["explain"] == "dtype_mismatch"
    assert doc["guard"] == f"{_demo.ADAPTER_LAYER}.lora_B.default"
    assert doc["moved"] == 4 and doc["scan_after"] is True
    assert doc["simulate_ok"] is False  # .to("cuda:1") leaves the list-held refiner behind
    assert doc["simulate_after_move_ok"] is True


def test_demo_text_names_paths_and_fixes(capsys: pytest.CaptureFixture[str]) -> None:
    assert _demo.run() == 0
    out = capsys.readouterr().out
    for fragment in (LORA_B, "refiners.0.weight", "latent_scale", "Fix:", "scan after move: ok",
                     "Module.to never moves it", "would it run? yes"):
        assert fragment in out, fragment


def test_plain_demo_text_and_json_name_the_same_culprit(capsys: pytest.CaptureFixture[str]) -> None:
    assert _demo.run(as_json=True, plain=True) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"] == "torch" and doc["ok"] is True
    assert doc["culprit"] == "attn.to_q.lora_B.default.weight" and doc["guard"] == "attn.to_q.lora_B.default"
    assert sorted(doc["scan"]) == ["attn.to_q.lora_B.default.weight", "latent_scale", "refiners.0.bias",
                                   "refiners.0.weight"]
    assert doc["scan_after"] is True and doc["simulate_ok"] is False and doc["simulate_after_move_ok"] is True
    assert _demo.run(plain=True) == 0
    text = capsys.readouterr().out
    assert f"culprit: {doc['culprit']}" in text.splitlines()


def test_diffusers_demo_text_and_json_name_the_same_culprit(capsys: pytest.CaptureFixture[str]) -> None:
    assert _demo.run(as_json=True, plain=False) == 0
    culprit = json.loads(capsys.readouterr().out)["culprit"]
    assert culprit == LORA_B
    assert _demo.run(plain=False) == 0
    assert f"culprit: {culprit}" in capsys.readouterr().out.splitlines()


def test_demo_runs_with_torch_alone() -> None:
    """diffusers, peft and numpy made unimportable (as on a machine with torch only): the torch model, exit 0, and
    no line of torch's own "Failed to initialize NumPy" warning before torchdoctor's first line (issue 42 point 1)."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['diffusers'] = None; sys.modules['peft'] = None; sys.modules['numpy'] = None\n"
            "from torchdoctor._cli.main import main; sys.exit(main(['demo', '--json']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert doc["model"] == "torch" and doc["culprit"] == "attn.to_q.lora_B.default.weight"
    assert "diffusers" not in out.stderr and "NumPy" not in out.stderr, out.stderr[:500]
