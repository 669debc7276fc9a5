"""``F.ctc_loss`` on an accelerator with its lengths on the CPU: CUDA takes CPU int64 (or int32) length tensors and
lists alike (its C++ composite reads them on the CPU, and moves CPU targets to the log-probs' device itself), so a
virtual run is quiet on every spelling, its loss is the CPU loss, and its backward runs. A real placement problem
next to it is still found."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdoctor
from torchdoctor._rules.registry import check_all

T, N, C, S = 12, 2, 5, 4


def _lengths(spelling: str, device: str) -> tuple[Any, Any]:
    if spelling == "list":
        return [T] * N, [S] * N
    dtype = torch.int32 if spelling == "int32" else torch.long
    return torch.full((N,), T, dtype=dtype, device=device), torch.full((N,), S, dtype=dtype, device=device)


def _inputs(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    log_probs = torch.randn(T, N, C, generator=g).log_softmax(2).to(device).requires_grad_()
    return log_probs, torch.randint(1, C, (N, S), generator=g).to(device)


CALLS: dict[str, Callable[..., torch.Tensor]] = {
    "positional": lambda lp, tg, il, tl: F.ctc_loss(lp, tg, il, tl),
    "keywords": lambda lp, tg, il, tl: F.ctc_loss(lp, tg, input_lengths=il, target_lengths=tl, reduction="mean"),
    "module": lambda lp, tg, il, tl: nn.CTCLoss(reduction="mean")(lp, tg, il, tl),
    "torch.ctc_loss": lambda lp, tg, il, tl: torch.ctc_loss(lp, tg, il, tl, 0, 1, False),
}


@pytest.mark.parametrize("spelling", ["int64", "int32", "list"])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_cpu_lengths_beside_device_log_probs_are_quiet(call: str, spelling: str) -> None:
    lp, tg = _inputs("cpu")
    want = CALLS[call](lp, tg, *_lengths(spelling, "cpu"))
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        log_probs, targets = _inputs("cuda")
        loss = CALLS[call](log_probs, targets, *_lengths(spelling, "cpu"))
        loss.backward()
        got = loss.item()
    assert sim.problems == [], [p.message for p in sim.problems]
    assert got == pytest.approx(want.item(), rel=1e-5)
    assert log_probs.grad is not None and log_probs.grad.shape == (T, N, C)


@pytest.mark.parametrize("where", ["cpu targets", "device lengths"])
def test_cpu_targets_and_device_lengths_are_quiet_too(where: str) -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        log_probs, targets = _inputs("cuda")
        lengths = _lengths("int64", "cuda" if where == "device lengths" else "cpu")
        F.ctc_loss(log_probs, targets.cpu() if where == "cpu targets" else targets, *lengths).backward()
    assert sim.problems == [], [p.message for p in sim.problems]


def test_the_rule_compares_only_the_log_probs_side() -> None:
    lp = torch.randn(T, N, C, device="meta").log_softmax(2)
    lp.__dict__["_td_device"] = torch.device("cuda:0")
    il, tl = _lengths("int64", "cpu")
    assert check_all(torch.ops.aten._ctc_loss.Tensor, (lp, torch.randint(1, C, (N, S)), il, tl), {}) == []


def test_a_real_problem_beside_the_loss_is_still_found() -> None:
    head = nn.Linear(C, C)
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        head.to("cuda")
        x = torch.randn(T, N, C)  # left on the cpu
        _, targets = _inputs("cuda")
        F.ctc_loss(head(x).log_softmax(2), targets, *_lengths("int64", "cpu"))
    assert [p.kind for p in sim.problems][:1] == ["device"], [p.message for p in sim.problems]
