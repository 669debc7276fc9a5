"""A tensor the program uses on the cpu first and then hands to the model it moved to the device (pytorch #163064:
compile on the cpu, move, compile again, call with the same input): the fix is at the use that changed device
(``compiled_cuda(x.to('cuda:0'))``), never ``device=`` at its maker, which would break the cpu half. The patch applied,
the whole program re-runs clean."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.apps import run_json

TOP = '''import torch, torch.nn as nn
model = nn.Linear(10, 4)
x = torch.randn(1, 10, requires_grad=True)
_ = model(x)
model.to("cuda")
out = model(x)
print(out.device)
'''
FUNC = '''import torch, torch.nn as nn
def check(net):
    batch = torch.ones(2, 6)
    ref = net(batch).sum()
    net.cuda()
    return net(batch).sum().cpu() - ref
print(check(nn.Sequential(nn.Linear(6, 3), nn.ReLU())))
'''
CASES = {"module level": (TOP, "out = model(x.to('cuda:0'))", "x = torch.randn(1, 10, requires_grad=True)\n"),
         "in a function": (FUNC, "return net(batch.to('cuda:0')).sum().cpu() - ref", "batch = torch.ones(2, 6)\n")}


@pytest.mark.parametrize("case", CASES)
def test_fixed_at_the_use_that_changed_device(tmp_path: Path, case: str) -> None:
    text, line, maker = CASES[case]
    app = tmp_path / "app.py"
    app.write_text(text)
    doc = run_json(app, "cuda")
    assert not doc["ok"]
    [fix] = doc["fixes"]
    assert fix["code"].startswith(line) and "uses it as it is" in fix["code"], fix
    assert fix["proven"] is True and "device=" not in doc["patch"]
    subprocess.run(["git", "apply", "-"], input=doc["patch"], cwd=tmp_path, text=True, check=True, timeout=60)
    assert line in app.read_text() and maker in app.read_text()  # the maker as it was: the cpu use keeps working
    again = run_json(app, "cuda")
    assert again["ok"] and not again["fixes"], again
