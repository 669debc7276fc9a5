"""Float8 operands an op meets on a GPU that holds float8 but has no kernel of that op in it (a model's storage dtype
taken as its compute dtype, ComfyUI #14285; ``a + b`` of float8 on xpu, torch-xpu-ops #1939): the fix is the compute
dtype at the op's line (its float8 operands cast to bfloat16 there, a patch proven at the op), never a move (the
device holds them) and never a cast of anything to float8. The patch applied, the whole program re-runs clean."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.apps import run_json

MODEL = '''import torch, torch.nn as nn
class Backbone(nn.Module):
    def __init__(s):
        super().__init__()
        s.proj = nn.Linear(8, 8)
        s.dtype = torch.float8_e4m3fn
    def forward(s, img):
        tokens = img.to(s.dtype)
        mask = torch.ones(1, 4, 1, device=img.device, dtype=tokens.dtype)
        x = tokens * mask
        return s.proj(x.to(torch.bfloat16).float())
m = Backbone().to("cuda")
print(m(torch.randn(2, 4, 8, device="cuda")).shape)
'''
TOP = '''import torch
def blend(dev):
    a = torch.randn(4, 4, device=dev).to(torch.float8_e5m2)
    b = torch.randn(4, 4, device=dev).to(torch.float8_e5m2)
    d = a - b
    return d.float()
print(blend("DEV").shape)
'''
CASES = {  # program, device, the op's line, that line as the fix writes it
    "model mul on cuda": (MODEL, "cuda", "        x = tokens * mask\n",
                          "        x = tokens.to(torch.bfloat16) * mask.to(torch.bfloat16)\n"),
    "top-level sub on xpu": (TOP.replace("DEV", "xpu"), "xpu", "    d = a - b\n",
                             "    d = a.to(torch.bfloat16) - b.to(torch.bfloat16)\n"),
    "torch.mul call on cuda": (TOP.replace("DEV", "cuda").replace("a - b", "torch.mul(a, b)"), "cuda",
                               "    d = torch.mul(a, b)\n",
                               "    d = torch.mul(a.to(torch.bfloat16), b.to(torch.bfloat16))\n"),
}


@pytest.mark.parametrize("case", CASES)
def test_float8_compute_is_fixed_at_the_op_never_by_a_move(tmp_path: Path, case: str) -> None:
    text, device, line, fixed = CASES[case]
    app = tmp_path / "app.py"
    app.write_text(text)
    doc = run_json(app, device)
    codes = " ".join(f["code"] for f in doc["fixes"])
    [fix] = doc["fixes"]
    assert fix["code"].startswith(fixed.strip()) and "is storage on " + device in fix["code"], fix
    assert "move(" not in codes and "cannot hold" not in codes and ".to(torch.float8" not in codes
    assert fix["proven"] is True
    subprocess.run(["git", "apply", "-"], input=doc["patch"], cwd=tmp_path, text=True, check=True, timeout=60)
    assert fixed in app.read_text() and line not in app.read_text()
    again = run_json(app, device)
    assert again["ok"] and not again["fixes"], again
