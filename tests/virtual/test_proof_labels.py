"""Fixes a run can prove are proven, and say how: an operand fixed at the program's call (a cpu gradient times a cuda
0-dim norm, NeMo Automodel PR #3461: ``g.mul_(coef.to(g.device))``) is re-run at the failing op on copies of its
operands with the fix applied; the patch applied leaves the run clean."""

from __future__ import annotations

from pathlib import Path

from tests.support.apps import run_json

CLIP = '''import torch, torch.nn as nn
model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2)).to("cuda")
model(torch.randn(3, 4, device="cuda")).sum().backward()
grads = [p.grad.detach().to("cpu") for p in model.parameters()]
def clip_(grads, max_norm):
    total = torch.zeros((), device="cuda")
    for g in grads:
        total += g.to("cuda").pow(2).sum()
    coef = (max_norm / (total.sqrt() + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef)
    return total
print(float(clip_(grads, 1.0)))
'''


def test_a_cuda_scalar_into_a_cpu_in_place_op_is_fixed_at_the_call_and_proven(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(CLIP)
    doc = run_json(app, "cuda")
    [fix] = doc["fixes"]
    assert fix["code"].startswith("g.mul_(coef.to(g.device))"), fix["code"]
    assert fix["proven"] is True and fix["tried"].startswith("at the failing op aten.mul_.Tensor at app.py:11")
    assert "+        g.mul_(coef.to(g.device))" in doc["patch"]
    app.write_text(CLIP.replace("g.mul_(coef)", "g.mul_(coef.to(g.device))"))
    again = run_json(app, "cuda")
    assert again["ok"] and not again["fixes"], again["problems"]
