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
