"""A training step the program runs on the CPU inside a virtual run (a warm-up before the move, a model it keeps on
the CPU) computes what it computes on the CPU. Its parameters are named by the run, so their ops run on twins: an
optimizer's in-place update then changed a private copy and the model never trained; and a norm's weight handed over
as a keyword (``F.batch_norm(..., weight=w)``) left the graph, so it got no grad."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


def _train(opt_name: str, device_after: str | None) -> tuple[list[float], dict[str, bool]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    opt = getattr(torch.optim, opt_name)(model.parameters(), lr=0.05)
    losses = []
    device = "cpu"
    for i in range(4):
        if i == 2 and device_after is not None:
            torchdoctor.move(model, device_after)  # moves the optimizer's state with the parameters
            device = device_after
        x = torch.randn(8, 4).to(device)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        loss.backward()
        opt.step()
        if i == 3:
            grads = {n: p.grad is not None for n, p in model.named_parameters()}
        opt.zero_grad()
        losses.append(round(float(loss.detach().cpu()), 4))
    return losses, grads


def test_sgd_and_adam_on_the_cpu_train_in_a_virtual_run_as_on_the_cpu() -> None:
    for opt_name in ("SGD", "Adam"):
        want = _train(opt_name, None)
        with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
            got = _train(opt_name, None)
        assert sim.problems == [], [p.message for p in sim.problems]
        assert got == want, opt_name  # losses and which parameters got grads (batch norm's too)
        assert all(want[1].values())


def test_a_warm_up_on_the_cpu_then_the_move_trains_as_on_the_cpu() -> None:
    want = _train("Adam", "cpu")
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        got = _train("Adam", "cuda:1")
    assert sim.problems == []
    assert got == want
