"""GradScaler on float16 parameters (QwenAudio/FunMusic#28: a model cast with ``.to(torch.float16)`` trained under
a GradScaler): torch refuses with "Attempting to unscale FP16 gradients". simulate reports it and its advice is the
float32 master weights under autocast — never a cast to float16 of "the tensors made in ?"."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


def _step(model: nn.Module) -> None:
    model.to("cuda:0").to(torch.float16)  # the report's cast of the trained model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(torch.randn(4, 8, device="cuda:0")).float().pow(2).mean()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()


def test_float16_parameters_under_a_grad_scaler_get_the_master_weights_advice() -> None:
    report = torchdoctor.simulate(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1)), device="cuda:0", call=_step)
    assert not report.ok
    assert any("Attempting to unscale FP16 gradients" in p.message for p in report.problems), report.text()
    codes = [f.code for f in report.fixes]
    assert any(c.startswith("# GradScaler unscales float32 gradients only: keep the trained parameters float32")
               for c in codes), codes
    assert not any("?" in c or "tensor.to(torch.float16)" in c for c in codes), codes
    assert "fix proven" not in report.text()
