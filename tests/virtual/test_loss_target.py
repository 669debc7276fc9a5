"""A training step's own mistakes, said once: a loss whose target is in another dtype than its input (huber_loss
computes it and its backward raises "Found dtype BFloat16 but expected Float") names the target as the call passes
it, and the factory that made it; an op autograd runs inside ``loss.backward()`` for a problem its forward already
showed is not a second problem."""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

import torchdoctor
from torchdoctor._virtual.makers import operand_fix
from torchdoctor._virtual.origin import LINES


def huber_step(m: nn.Module) -> torch.Tensor:
    m.to("cuda:0", torch.bfloat16)
    latents = torch.randn(2, 8, device="cuda:0", dtype=torch.bfloat16)
    noise = torch.randn_like(latents)
    pred = m(latents + noise)
    target = noise
    loss = F.huber_loss(pred.float(), target, delta=0.1)
    loss.backward()
    return loss


def test_a_loss_target_in_another_dtype_is_named_at_the_call_with_its_maker() -> None:
    report = torchdoctor.simulate(nn.Linear(8, 8), device="cuda:0", dtype=torch.bfloat16, call=huber_step)
    assert len(report.problems) == 1, report.problems  # the backward's huber_loss_backward is the same problem
    p = report.problems[0]
    assert p.kind == "dtype" and p.found == "bfloat16" and p.expected == "float32"
    assert p.message.startswith("target at ") and "test_loss_target.py:" in p.message.split(" (")[0]
    assert "made by torch.randn_like in code outside the model at " in p.message
    assert ".float()" not in p.message  # the deliberate upcast of the prediction is not the culprit


def test_the_operand_fix_casts_it_where_the_call_passes_it(tmp_path) -> None:
    src = tmp_path / "train.py"
    src.write_text("target = noise\nloss = F.huber_loss(pred.float(), target, delta=0.1)\n")
    LINES["train.py:2"] = (str(src), 2)
    try:
        line, diff = operand_fix("operand target at train.py:2", torch.float32)  # type: ignore[misc]
    finally:
        del LINES["train.py:2"]
    assert line == "loss = F.huber_loss(pred.float(), target.to(torch.float32), delta=0.1)"
    assert diff is not None and "+loss = F.huber_loss(pred.float(), target.to(torch.float32), delta=0.1)" in diff


def test_a_loss_with_no_gradient_through_it_is_no_problem() -> None:
    def evaluate(m: nn.Module) -> torch.Tensor:
        m.to("cuda:0", torch.bfloat16)
        x = torch.randn(2, 8, device="cuda:0", dtype=torch.bfloat16)
        with torch.no_grad():
            return F.huber_loss(m(x).float(), x)

    assert torchdoctor.simulate(nn.Linear(8, 8), device="cuda:0", dtype=torch.bfloat16, call=evaluate).ok


class DiT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.img_in, self.out = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.img_in(h)))


def promoted_step(m: nn.Module) -> torch.Tensor:
    m.to("cuda:0", torch.bfloat16)
    latents = torch.randn(2, 4, 8, device="cuda:0", dtype=torch.bfloat16)
    sigmas = torch.tensor([1.0, 0.5], device="cuda:0").view(-1, 1, 1)  # float32: promotes the latents
    pred = m((1.0 - sigmas) * latents)
    loss = F.mse_loss(pred.float(), latents.float())
    loss.backward()
    return loss


def test_backward_of_an_op_already_reported_is_not_a_second_problem() -> None:
    report = torchdoctor.simulate(DiT(), device="cuda:0", dtype=torch.bfloat16, call=promoted_step)
    assert not report.ok
    assert [p.path for p in report.problems] == ["img_in"], report.problems
    assert not any(p.path == "<top level>" for p in report.problems)
    # the maker of the float32 and the line where it promoted the bfloat16 latents, both named
    msg, line = report.problems[0].message, promoted_step.__code__.co_firstlineno + 4
    assert "torch.tensor" in msg and re.search(rf"promot\w* bfloat16 (data )?(at|to) ", msg), msg
    assert f"test_loss_target.py:{line}" in msg, msg
