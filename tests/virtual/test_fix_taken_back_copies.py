"""Copies of a model's parameters the program's own line took to the cpu (a CPU master copy, an EMA) and handed to
the model's forward (``functional_call``): one fix for that line, naming every copy as the program holds it, proven
at the failing op; never a line per tensor, never "inside the forward" (no forward ran that line)."""

from __future__ import annotations

from pathlib import Path

from support.apps import run_json

MASTER = """\
import torch, torch.nn as nn
class M(nn.Module):
    def __init__(s):
        super().__init__(); s.lin = nn.Linear(4, 4)
    def forward(s, x): return s.lin(x)
model = M().to("cuda:1")
master = {n: p.detach().cpu() for n, p in model.named_parameters()}
x = torch.randn(2, 4, device="cuda:1")
print(torch.func.functional_call(model, master, (x,)).shape)
"""

EMA = """\
import torch, torch.nn as nn
net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to("cuda")
ema = {k: v.detach().to("cpu") for k, v in net.named_parameters()}
print(torch.func.functional_call(net, ema, (torch.ones(3, 4, device="cuda"),)).shape)
"""


def test_a_cpu_master_copy_is_one_fix_at_its_line(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(MASTER)
    doc = run_json(app, "cuda:1")
    (fix,) = doc["fixes"]
    assert fix["code"] == ("# app.py:7 takes copies of lin.weight, lin.bias to cpu (held as master['lin.weight'], "
                           "master['lin.bias']) and they are handed to a module on cuda:1: keep them where the model "
                           "is (drop `.cpu()`), or move them back where they are passed ({k: v.to(x.device) for k, v "
                           "in master.items()})"), fix
    assert fix["proven"], fix["tried"]


def test_an_ema_taken_with_to_cpu_is_named_once(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(EMA)
    doc = run_json(app, "cuda")
    codes = [f["code"] for f in doc["fixes"]]
    assert len(codes) == 1 and codes[0].startswith("# app.py:3 takes copies of 0.weight, 0.bias, 2.weight, 2.bias "
                                                   "to cpu (held as ema['0.weight']"), codes
    assert "inside the forward" not in codes[0] and "ema.items()" in codes[0], codes
