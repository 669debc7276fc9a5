"""``torchdoctor.scan({"model": m, "ema": ema})`` in Python, as the CLI does for a TARGET returning a dict: a
component's move is written by key (``obj['ema'].to('cuda:0')``), never ``model.ema.to(...)``, an attribute the dict
does not have; a module keeps ``model.<path>``."""

from __future__ import annotations

from torch import nn

import torchdoctor


def test_a_dict_scanned_in_python_gets_its_moves_by_key() -> None:
    with torchdoctor.virtual_devices("cuda:0"):
        model = nn.Linear(4, 4).to("cuda:0")
        report = torchdoctor.scan({"model": model, "ema": nn.Linear(4, 4)}, device="cuda:0")
    text = str(report)
    assert "obj['ema'].to('cuda:0')" in text and "model.ema" not in text
    assert [r["fix"] for r in report.to_dict()["relocations"]] == ["obj['ema'].to('cuda:0')"]


def test_a_module_keeps_its_attribute_paths() -> None:
    report = torchdoctor.scan(nn.Sequential(nn.Linear(4, 4)), device="cuda:0")
    assert "keyed" not in report.extra
    assert [r["fix"] for r in report.to_dict()["relocations"]] == ["model.to('cuda:0')"]
