"""Training programs of three kinds finish on virtual cuda:1 with 0 problems (issue 40, point 1): a peft LoRA
model, an sd-scripts-style network patched into a model's Linear layers, and a real ``transformers.Trainer`` loop;
gradient checkpointing inside autocast (reentrant or not) and bitsandbytes' 8-bit optimizers on their CPU path.
Planted training bugs are named by path with the program's line. The programs say "cuda": ``select=True`` makes
cuda:1 the current device, as ``torch.cuda.set_device(1)`` would."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import torchdoctor
from tests.virtual import rt_apps
from torchdoctor._virtual.session import VirtualSession

CUDA1 = torch.device("cuda", 1)


def test_a_peft_lora_loop_finishes_with_no_problem() -> None:
    with torchdoctor.virtual_devices("cuda:1", select=True) as sim:
        lora_b = rt_apps.lora_llama_steps()
    assert sim.ok and sim.ran_on == ("cuda:1",)
    assert lora_b.weight.device == CUDA1 and lora_b.weight.abs().sum().item() > 0  # trained from its zero init


def test_an_sd_scripts_style_network_moved_with_network_to_trains_with_no_problem() -> None:
    with torchdoctor.virtual_devices("cuda:1", select=True) as sim:
        network = rt_apps.sd_network_steps()
    assert sim.ok and sim.ran_on == ("cuda:1",)
    up = network.loras[0].lora_up.weight
    assert up.device == CUDA1 and up.abs().sum().item() > 0


def test_a_transformers_trainer_loop_finishes_and_says_where_it_ran() -> None:
    """Trainer sees two GPUs, takes cuda:0 and wraps the model in DataParallel over both (as on a real two-GPU
    machine): scatter, replicate and gather run as virtual moves, and the report says where the work went."""
    with torchdoctor.virtual_devices("cuda:1", select=True) as sim:
        result, model = rt_apps.trainer_steps()
    assert sim.ok, sim.problems
    assert result.global_step == 3 and result.training_loss > 0
    assert next(model.parameters()).device == torch.device("cuda", 0)
    assert sim.ran_on == ("cuda:0", "cuda:1")
    assert sim.where_ran() == "ran on cuda:0, cuda:1 (the program picked them; cuda:1 was asked for)"


@pytest.mark.parametrize("reentrant", [True, False])
def test_gradient_checkpointing_inside_autocast(reentrant: bool) -> None:
    """The recomputation runs inside the backward pass: with the run's autocast and the run's devices."""
    with torchdoctor.virtual_devices("cuda:1", select=True) as sim:
        m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to("cuda")
        x = torch.randn(3, 4, device="cuda", requires_grad=True)  # a leaf that asks for grad keeps asking
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = checkpoint(m, x, use_reentrant=reentrant)
        out.float().sum().backward()
    assert sim.ok, sim.problems
    assert out.dtype == torch.bfloat16 and x.requires_grad
    assert m[0].weight.grad is not None and m[0].weight.grad.device == CUDA1
    assert m[0].weight.grad.dtype == torch.float32 and x.grad is not None and x.grad.device == CUDA1


@pytest.mark.parametrize("name", ["AdamW8bit", "Adam8bit"])
def test_bitsandbytes_8bit_optimizers_step_on_their_cpu_path(name: str) -> None:
    bnb = pytest.importorskip("bitsandbytes")
    with torchdoctor.virtual_devices("cuda:1", select=True) as sim:
        m = nn.Linear(64, 64).to("cuda")  # 4096 elements: bitsandbytes keeps 8-bit state from 4096 up
        before = m.weight.detach().clone()
        opt = getattr(bnb.optim, name)(m.parameters(), lr=1e-2)
        for _ in range(2):
            m(torch.randn(3, 64, device="cuda")).sum().backward()
            opt.step()
            opt.zero_grad()
    assert sim.ok, sim.problems
    state = opt.state[m.weight]
    assert state["state1"].dtype == torch.uint8 and state["state1"].device == CUDA1
    assert not torch.equal(m.weight.detach().cpu(), before.cpu())


def _problem(sim: VirtualSession, path: str) -> torchdoctor.Problem:
    return next(p for p in sim.problems if p.path == path)


def test_a_gradient_of_another_dtype_is_named_with_the_line() -> None:
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False, select=True) as sim:
        m = nn.Linear(4, 2).to("cuda")
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        m(torch.ones(3, 4, device="cuda")).sum().backward()
        m.weight.data = m.weight.data.half()  # the planted bug: cast after backward, its gradient stays float32
        opt.step()
    p = _problem(sim, "weight.grad")
    assert (p.kind, p.found, p.expected, p.op) == ("dtype", "float32", "float16", "Optimizer.step")
    assert "a gradient in float32 while its parameter is float16" in p.message
    assert any(f == __file__ for f, _, _ in sim.stacks[("dtype", "weight.grad")])


@pytest.mark.parametrize(("device", "made_for", "said"), [
    ("cuda:1", "cpu", "GradScaler('cpu') scales a loss on cuda:1: its scale and inf checks live on cpu"),
    ("xpu", "cuda", "GradScaler('cuda') scales a loss on xpu:0: it turned itself off"),
])
def test_a_grad_scaler_for_another_device_is_named(device: str, made_for: str, said: str) -> None:
    with torchdoctor.virtual_devices(device, raise_on_exit=False) as sim:
        m = nn.Linear(4, 2).to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        with pytest.warns(UserWarning) if made_for == "cuda" else contextlib.nullcontext():
            scaler = torch.amp.GradScaler(made_for)  # the planted bug
        scaler.scale(m(torch.ones(3, 4, device=device)).sum()).backward()
        scaler.step(opt)
        scaler.update()
    p = _problem(sim, "<scaler>")
    assert (p.kind, p.found, p.op) == ("device", made_for, "GradScaler.scale")
    assert p.message.startswith(said), p.message
    assert p.message.endswith(f"Make it for the device: torch.amp.GradScaler({device[:4].rstrip(':')!r})")
    assert any(f == __file__ for f, _, _ in sim.stacks[("device", "<scaler>")])


def test_a_grad_scaler_for_the_device_is_quiet() -> None:
    with torchdoctor.virtual_devices("cuda:1", select=True) as sim:
        m = nn.Linear(4, 2).to("cuda")
        scaler = torch.amp.GradScaler("cuda")
        scaler.scale(m(torch.ones(3, 4, device="cuda")).sum()).backward()
    assert sim.ok


def test_an_ema_copy_left_on_the_cpu_is_named_at_the_line() -> None:
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False, select=True) as sim:
        m = nn.Linear(4, 2)
        ema = copy.deepcopy(m)  # the planted bug: the EMA copy is made before the move and never moved
        m.to("cuda")
        torch.optim.SGD(m.parameters(), lr=0.1)
        with torch.no_grad():
            for e, p in zip(ema.parameters(), m.parameters()):
                e.lerp_(p, 0.1)
    [p] = [p for p in sim.problems if p.op == "aten.lerp_.Scalar"]
    # named as the program holds it (the copy never runs a forward, so no module of the run names it)
    assert (p.kind, p.path, p.role, p.found, p.expected) == ("device", "ema.weight", "held", "cpu", "cuda:1")
    assert "ema.weight f32[2,4]@cpu is on cpu while aten.lerp_.Scalar runs on cuda:1" in p.message
    assert any(f == __file__ for f, _, _ in sim.stacks[(p.kind, p.path)])
    text = str(sim.error())
    assert "ema.to('cuda:1')  # ema.weight is on cpu" in text
    # a block runs once: its fix is proven at the failing op, on copies of the operands moved as it says
    assert "# fix proven (at the failing op aten.lerp_.Scalar at " in text
    assert [(f.code.split("  #")[0], f.proven) for f in sim.fixes] == [("ema.to('cuda:1')", True)]
