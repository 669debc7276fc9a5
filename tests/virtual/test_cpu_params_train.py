"""A training step whose trained parameters were left on the CPU (a LoRA patch ``w + up @ down`` per call, ComfyUI's
TrainLoraNode): the device problem is reported and the run goes on as a training step would, gradients included,
never ending in an error of the run's own making ("element 0 of tensors does not require grad")."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


import torchdoctor


class Patched(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight + (self.up @ self.down).to(self.weight.dtype)  # the adapter, on the cpu
        return F.linear(x, w, self.bias)


def train(m: nn.Module) -> torch.Tensor:
    m.to("cuda:0").requires_grad_(False)
    m.up, m.down = nn.Parameter(torch.zeros(8, 2)), nn.Parameter(torch.randn(2, 8))  # never moved
    opt = torch.optim.AdamW([m.up, m.down], lr=1e-3)
    for _ in range(2):
        loss = F.mse_loss(m(torch.randn(2, 8, device="cuda:0")), torch.zeros(2, 8, device="cuda:0"))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return loss


def test_cpu_adapter_params_are_reported_and_the_step_runs_through() -> None:
    report = torchdoctor.simulate(Patched(8, 8), device="cuda:0", call=train)
    assert [p.kind for p in report.problems][:1] == ["device"]
    assert report.stopped is None, report.stopped  # no error of the run's own continuation
    assert "does not require grad" not in str(report)
