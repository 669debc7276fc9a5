"""A module moved off its device and back in a virtual run holds the same ``Parameter`` objects, as ``Module.to``
keeps them on the device: a block-swap or offload trainer's optimizer steps every block (the swapped ones too), its
state stays keyed by them, hooks registered on them fire, an ``id(p)`` map still names them, and an optimizer state
loaded while a block sat on the cpu is met beside its parameter at the step. Each case runs on the CPU first: the
virtual run must compute and hold what the CPU run does."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdoctor


def _round_trip(dev: str, foreach: bool) -> dict[str, Any]:
    """Four blocks on ``dev``, AdamW built, the last block moved to the cpu and back, one step."""
    torch.manual_seed(0)
    blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(4)]).to(dev)
    opt = torch.optim.AdamW(blocks.parameters(), lr=1e-2, foreach=foreach)
    w3 = blocks[3].weight
    blocks[3].to("cpu")
    blocks[3].to(dev)
    same = blocks[3].weight is w3
    before = [b.weight.detach().cpu().clone() for b in blocks]
    x = torch.randn(4, 8, device=dev)
    for b in blocks:
        x = F.gelu(b(x))
    x.pow(2).mean().backward()
    opt.step()
    return {"same": same, "updated": [bool((b.weight.detach().cpu() - w).abs().max() > 0)
                                      for b, w in zip(blocks, before)],
            "state": len(opt.state), "weights": [b.weight.detach().cpu().clone() for b in blocks]}


@pytest.mark.parametrize("foreach", [False, True])
def test_a_block_moved_to_the_cpu_and_back_is_the_parameter_the_optimizer_steps(foreach: bool) -> None:
    want = _round_trip("cpu", foreach)
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        got = _round_trip("cuda", foreach)
    assert sim.problems == [], [p.message for p in sim.problems]
    assert (got["same"], got["updated"], got["state"]) == (True, [True] * 4, 8) == \
        (want["same"], want["updated"], want["state"])
    for a, b in zip(got["weights"], want["weights"]):
        torch.testing.assert_close(a, b)


def _block_swap(dev: str, steps: int = 3) -> tuple[list[torch.Tensor], int, list[int]]:
    """musubi-style: the last two blocks live on the cpu between steps and come to ``dev`` for the step."""
    torch.manual_seed(0)
    blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(4)]).to(dev)
    opt = torch.optim.AdamW(blocks.parameters(), lr=1e-2)
    ids = {id(p): n for n, p in blocks.named_parameters()}  # made on the device, read after the swaps
    for b in blocks[2:]:
        b.to("cpu")
    for _ in range(steps):
        for b in blocks[2:]:
            b.to(dev)
        x = torch.randn(4, 8, device=dev)
        for b in blocks:
            x = F.gelu(b(x))
        x.pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        for b in blocks[2:]:
            b.cpu()
    for b in blocks[2:]:  # (while they sit on the cpu the run holds them as real tensors: other objects)
        b.to(dev)
    named = [int(ids.get(id(p), "-1").split(".")[0]) for p in blocks.parameters()]
    return [p.detach().cpu().clone() for p in blocks.parameters()], len(opt.state), named


def test_a_block_swap_trainer_trains_every_block_as_on_the_cpu() -> None:
    want, wstate, wnamed = _block_swap("cpu")
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        got, state, named = _block_swap("cuda")
    assert sim.problems == [], [p.message for p in sim.problems]
    assert (state, named) == (wstate, wnamed) == (8, [0, 0, 1, 1, 2, 2, 3, 3])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("swap", [True, False])
def test_the_swap_on_conversion_flag_both_ways(swap: bool) -> None:
    # with the flag Module._apply swaps the tensors (the object kept on the device): a real parameter and its
    # virtual twin cannot be swapped, so the run keeps the object its own way, and the program's flag stays as set
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(swap)
    try:
        want = _round_trip("cpu", False)
        with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
            got = _round_trip("cuda", False)
            seen = torch.__future__.get_swap_module_params_on_conversion()
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)
    assert seen is swap
    assert sim.problems == [], [p.message for p in sim.problems]
    assert (got["same"], got["updated"], got["state"]) == (want["same"], want["updated"], want["state"]) == \
        (True, [True] * 4, 8)


def test_the_overwrite_on_conversion_flag_makes_new_parameters_as_on_the_device() -> None:
    # the program asked Module._apply for new objects: the device gives them, so the run gives them too
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        want = _round_trip("cpu", False)
        with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False):
            got = _round_trip("cuda", False)
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)
    assert (got["same"], got["updated"], got["state"]) == (want["same"], want["updated"], want["state"]) == \
        (False, [True, True, True, False], 6)


def _hooks(dev: str, early: bool) -> list[str]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    fired: list[str] = []

    def register() -> None:  # kohya's fused step: the update runs in a hook on the parameter
        m[1].weight.register_post_accumulate_grad_hook(lambda p: fired.append("step"))
        m[1].bias.register_hook(lambda g: fired.append("grad"))

    if early:
        register()
    m.to(dev)
    if not early:
        register()
    for _ in range(2):
        m[1].cpu()
        m[1].to(dev)
        m(torch.randn(2, 4, device=dev)).sum().backward()
    return fired


@pytest.mark.parametrize("early", [True, False])
def test_hooks_on_a_parameter_fire_wherever_its_module_went(early: bool) -> None:
    want = _hooks("cpu", early)
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False):
        got = _hooks("cuda", early)
    assert got == want == ["grad", "step"] * 2


def _resume(dev: str, load_on_cpu: bool, foreach: bool) -> None:
    """SimpleTuner's resume with block swap: the optimizer state loaded while the swapped block sits on the cpu
    (torch puts each state tensor on its parameter's device then), the step with it back on ``dev``."""
    torch.manual_seed(0)
    blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)]).to(dev)
    opt = torch.optim.AdamW(blocks.parameters(), lr=1e-3, foreach=foreach)

    def step() -> None:
        blocks[1].to(dev)
        blocks[1](blocks[0](torch.randn(4, 8, device=dev))).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        blocks[1].to("cpu")

    step()
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    opt = torch.optim.AdamW(blocks.parameters(), lr=1e-3, foreach=foreach)
    if not load_on_cpu:
        blocks[1].to(dev)
    buf.seek(0)
    opt.load_state_dict(torch.load(buf))
    blocks[1].to("cpu")
    step()


@pytest.mark.parametrize("foreach", [False, True])
def test_a_state_loaded_while_its_block_sat_on_the_cpu_is_found_at_the_step(foreach: bool) -> None:
    _resume("cpu", True, foreach)  # the program itself runs on the cpu
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        _resume("cuda", True, foreach)
    [p] = [p for p in sim.problems if p.kind == "device"]
    assert p.path.startswith("optimizer.state[") and p.path.endswith("weight].exp_avg"), p.path
    # named as the program holds it, the load's line, the move that had put the block on the cpu, the move back
    here = "test_param_identity_moves.py:"
    assert "optimizer state on cpu (opt.state[blocks[1].weight]['exp_avg']) while its parameter is on cuda:0 " \
           "when opt.step() at " in p.message, p.message
    assert re.search(rf"opt\.load_state_dict at \S*{here}\d+ put it on the cpu, where its parameter was then: "
                     rf"`step\(\)` at \S*{here}\d+ \(in `_resume.<locals>.step` at \S*{here}\d+\) had moved", p.message)
    assert re.search(rf"had moved `blocks\.1` there, and `blocks\[1\]\.to\(dev\)` at \S*{here}\d+ brought it back",
                     p.message), p.message
    [fix] = sim.fixes
    assert fix.code.startswith("# load opt's state while its parameters are on cuda:0: bring the swapped blocks "
                               "back before opt.load_state_dict at "), fix.code
    assert "moving the blocks themselves would undo the swap" in fix.code and not fix.proven and fix.tried
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        _resume("cuda", False, foreach)  # loaded with every block on the device: the state follows no later move
    assert sim.problems == [], [p.message for p in sim.problems]


def _offload_hook_training(dev: str) -> list[float]:
    """diffusers' ``enable_model_cpu_offload`` during training: accelerate's hook brings the model for the forward,
    the trainer offloads it after each step; the optimizer was built on the cpu, before any of it."""
    from accelerate import cpu_offload_with_hook

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    m, hook = cpu_offload_with_hook(m, execution_device=dev)
    for _ in range(3):
        m(torch.randn(2, 8, device=dev)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        hook.offload()
    return [float(p.detach().cpu().sum()) for p in m.parameters()]


def _peft_swap_training(dev: str) -> list[float]:
    """A LoRA-wrapped block swapped to the cpu between steps; only the adapters are trained."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
    m = get_peft_model(base, LoraConfig(r=2, target_modules=["0", "2"], init_lora_weights=False)).to(dev)
    trained = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=1e-2)
    swapped = m.base_model.model[2]
    for _ in range(3):
        swapped.to(dev)
        m(torch.randn(2, 8, device=dev)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        swapped.to("cpu")
    swapped.to(dev)
    return [float(p.detach().cpu().sum()) for p in trained]


@pytest.mark.parametrize("train", [_offload_hook_training, _peft_swap_training], ids=["accelerate-hook", "peft"])
def test_offloaded_training_with_the_libraries_computes_what_the_cpu_does(train: Any) -> None:
    want = train("cpu")
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        got = train("cuda")
    assert sim.problems == [], [p.message for p in sim.problems]
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)


def _loaded_swapped_out(dev: str) -> None:
    """The optimizer built on the device, its state loaded while a block is swapped out by the program's own line."""
    torch.manual_seed(0)
    blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)]).to(dev)
    opt = torch.optim.AdamW(blocks.parameters(), lr=1e-3)
    blocks[1](blocks[0](torch.randn(2, 8, device=dev))).sum().backward()
    opt.step()
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    blocks[1].to("cpu")  # swapped out
    opt.load_state_dict(torch.load(buf))
    blocks[1].to(dev)
    blocks[1](blocks[0](torch.randn(2, 8, device=dev))).sum().backward()
    opt.step()


def test_a_state_loaded_into_an_optimizer_built_on_the_device_while_a_block_is_out_is_found() -> None:
    _loaded_swapped_out("cpu")
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        _loaded_swapped_out("cuda")
    [p] = [p for p in sim.problems if p.kind == "device"]
    assert "(opt.state[blocks[1].weight]['exp_avg']) while its parameter is on cuda:0" in p.message, p.message
    assert re.search(r"where its parameter was then: `blocks\[1\]\.to\(\"cpu\"\)` at \S+:\d+ had moved `blocks\.1` "
                     r"there, and `blocks\[1\]\.to\(dev\)` at \S+:\d+ brought it back", p.message), p.message
