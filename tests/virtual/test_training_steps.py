"""Training on virtual devices (issue 40, point 1): forward, backward, autograd.grad, optimizers (foreach and
fused), clip_grad_norm_, GradScaler with autocast, gradient checkpointing and an EMA copy run under
``virtual_devices("cuda:1")`` with 0 problems; planted training bugs are named by path."""

from __future__ import annotations

from pathlib import Path

import peft
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import torchdoctor
from tests.support import zoo


def _step(foreach: bool | None, fused: bool | None) -> float:
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to("cuda:1")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=foreach, fused=fused)
    sgd = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    ema = [p.detach().clone() for p in m.parameters()]
    x, y = torch.randn(5, 4, device="cuda:1"), torch.randn(5, 2, device="cuda:1")
    for _ in range(2):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = ((m(x) - y) ** 2).mean()
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        sgd.step()
        with torch.no_grad():
            for e, p in zip(ema, m.parameters()):
                e.lerp_(p, 0.1)
    checkpoint(m, x, use_reentrant=False).sum().backward()  # gradient checkpointing: the forward runs again
    (g,) = torch.autograd.grad(m(x).sum(), m[0].weight)
    assert g.device == torch.device("cuda:1") and g.shape == (8, 4)
    assert m[0].weight.grad is not None and m[0].weight.grad.device == torch.device("cuda:1")
    return float(loss.item())


@pytest.mark.parametrize(("foreach", "fused"), [(None, None), (True, None), (None, True)])
def test_a_correct_training_step_finishes_with_no_problem(foreach: bool | None, fused: bool | None) -> None:
    torch.manual_seed(0)
    with torchdoctor.virtual_devices("cuda:1") as sim:
        loss = _step(foreach, fused)
    assert sim.ok and loss > 0


def test_the_values_are_the_cpus() -> None:
    """data="cpu": the step computes as on the CPU, so the loss goes down as it would there."""
    def losses() -> list[float]:
        torch.manual_seed(0)
        m = nn.Linear(4, 1).to("cuda:1")
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        x, y = torch.randn(8, 4, device="cuda:1"), torch.randn(8, 1, device="cuda:1")
        out = []
        for _ in range(3):
            loss = ((m(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(loss.item())
        return out

    with torchdoctor.virtual_devices("cuda:1") as sim:
        seen = losses()
    assert sim.ok and seen[2] < seen[0]


def test_a_peft_lora_step_finishes_with_no_problem() -> None:
    with torchdoctor.virtual_devices("cuda:1") as sim:
        model = peft.get_peft_model(zoo.tiny_llama(), peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
        model.to("cuda:1")
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        ids = torch.randint(0, 100, (2, 8), device="cuda:1")
        for _ in range(2):
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            opt.step()
            opt.zero_grad()
        lora_b = model.base_model.model.model.layers[0].self_attn.q_proj.lora_B.default.weight
    assert sim.ok, sim.problems
    assert lora_b.device == torch.device("cuda:1") and lora_b.abs().sum().item() > 0  # it was trained


def test_an_optimizer_state_left_on_the_cpu_and_a_cpu_loss_are_named() -> None:
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        model = nn.Linear(4, 2).to("cuda:1")
        opt = torch.optim.Adam(model.parameters())
        model(torch.ones(3, 4, device="cuda:1")).sum().backward()
        opt.step()
        for state in opt.state.values():  # the planted bug: state moved off the device
            state["exp_avg"] = state["exp_avg"].cpu()
        out = model(torch.ones(3, 4, device="cuda:1")).cpu()
        loss = (out - torch.zeros(3, 2)).pow(2).mean()  # the planted bug: the loss on the cpu
        loss.backward()
        opt.step()
    found = {p.path: p for p in sim.problems}
    assert {"optimizer.state[weight].exp_avg", "<loss>"} <= set(found)  # one optimizer's state: one finding
    state = found["optimizer.state[weight].exp_avg"]
    assert "and 1 more (exp_avg of 2 parameter(s))" in state.message
    assert (state.kind, state.found, state.expected, state.op) == ("device", "cpu", "cuda:1", "Optimizer.step")
    assert "optimizer state on cpu (taken to cpu by `.cpu()` at " in state.message  # the program's line moved it
    moved = next(i for i, ln in enumerate(Path(__file__).read_text().splitlines(), 1)
                 if '= state["exp_avg"].cpu()' in ln)
    assert f"test_training_steps.py:{moved}) while its parameter is on cuda:1 when opt.step() at " in state.message
    assert found["<loss>"].message.startswith("the loss f32[]@cpu is computed on the cpu while the model trains on")
    here = __file__
    assert any(f == here for f, _, _ in sim.stacks[("device", "optimizer.state[weight].exp_avg")])


def test_a_gradient_on_another_device_than_its_parameter_is_named() -> None:
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        model = nn.Linear(4, 2).to("cuda:1")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(3, 4, device="cuda:1")).sum().backward()
        model.weight.grad = model.weight.grad.cpu()  # a gradient brought back and set by hand
        opt.step()
    p = next(p for p in sim.problems if p.path == "weight.grad")
    assert (p.kind, p.found, p.expected) == ("device", "cpu", "cuda:1")
    assert "a gradient on cpu while its parameter is on cuda:1" in p.message
