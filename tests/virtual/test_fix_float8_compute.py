"""Float8 operands an op meets on a GPU that holds float8 but has no kernel of that op in it (a model's storage dtype
taken as its compute dtype, ComfyUI #14285; ``a + b`` of float8 on xpu, torch-xpu-ops #1939): the fix is the compute
dtype at the op, never a move (the device holds them) and never a cast of anything to float8. The advice applied
(the operands cast to bfloat16 at the op's line) leaves the run clean."""

from __future__ import annotations

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
CASES = {  # program, device, the op's line, that line with the advice applied
    "model mul on cuda": (MODEL, "cuda", "        x = tokens * mask\n",
                          "        x = tokens.to(torch.bfloat16) * mask.to(torch.bfloat16)\n"),
    "top-level sub on xpu": (TOP.replace("DEV", "xpu"), "xpu", "    d = a - b\n",
                             "    d = a.to(torch.bfloat16) - b.to(torch.bfloat16)\n"),
}


@pytest.mark.parametrize("case", CASES)
def test_float8_compute_is_fixed_at_the_op_never_by_a_move(tmp_path: Path, case: str) -> None:
    text, device, line, fixed = CASES[case]
    app = tmp_path / "app.py"
    app.write_text(text)
    doc = run_json(app, device)
    codes = " ".join(f["code"] for f in doc["fixes"])
    assert "holds float8_e" in codes and "cast the float8 operands to torch.bfloat16" in codes
    assert "move(" not in codes and "cannot hold" not in codes and ".to(torch.float8" not in codes
    assert all(not f["proven"] for f in doc["fixes"])  # said, with why it was not re-run
    app.write_text(text.replace(line, fixed))  # the advice applied at the op's line
    again = run_json(app, device)
    assert again["ok"] and not again["fixes"], again
