"""A library's own float64 factory (torch's ``WeightedRandomSampler`` runs ``torch.as_tensor(weights,
dtype=torch.double)``) under the program's line, with mps the default device (pytorch #125844): the fix names the
program's line and the cause (the default device), says to run it on the cpu; never ``dtype=`` at a factory the line
does not hold, never a cast before a move when nothing moved. Written as said, the program runs clean."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.apps import run_json

GLOBAL = '''import torch
from torch.utils.data import WeightedRandomSampler
torch.set_default_device("mps")
sampler = WeightedRandomSampler(weights=[0.1] * 4 + [0.9] * 4, num_samples=8)
print(list(sampler)[:2])
'''
BLOCK = '''import torch
from torch.utils.data import WeightedRandomSampler
def pick():
    with torch.device("mps"):
        s = WeightedRandomSampler([1.0, 2.0, 3.0], 2)
        return list(s)
print(pick())
'''
CASES = {"set_default_device": (GLOBAL, "sampler = WeightedRandomSampler(", "app.py:4"),
         "a with torch.device block": (BLOCK, "s = WeightedRandomSampler(", "app.py:5")}


@pytest.mark.parametrize("case", CASES)
def test_library_float64_names_the_line_and_the_default_device(tmp_path: Path, case: str) -> None:
    text, line, at = CASES[case]
    app = tmp_path / "app.py"
    app.write_text(text)
    doc = run_json(app, "mps")
    assert not doc["ok"]
    [fix] = doc["fixes"]
    code = fix["code"]
    assert f"# {at}: `{line}" in code and "torch.as_tensor" in code and "default device" in code, code
    assert "with torch.device('cpu'): " + line in code and "before mov" not in code and "pass dtype=" not in code
    assert fix["proven"] is False
    app.write_text(text.replace(line, "with torch.device('cpu'): " + line) if case == "set_default_device"
                   else text.replace("        " + line, "        with torch.device('cpu'):\n            " + line))
    again = run_json(app, "mps")
    assert again["ok"] and not again["fixes"], again
