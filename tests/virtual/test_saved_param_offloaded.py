"""A parameter an op saved for its backward is the parameter itself (``native_layer_norm`` saves its weight), so an
offload that swaps the parameter's data away after the forward (``Module.to("cpu")``, ``p.data = p.data.to("cpu")``:
diffusers' group offloading after each block) is what the backward reads. A linear saves a view of the old data
(``weight.t()``), which keeps it. The virtual backward sees the same, and says who moved it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor


@pytest.mark.parametrize("make, fails", [(lambda: nn.LayerNorm(4), True), (lambda: nn.Linear(4, 4), False)])
def test_on_the_cpu_a_saved_weight_swapped_after_the_forward_is_what_the_backward_reads(make, fails) -> None:
    # the mechanism, checked on real tensors with a dtype swap (what Module.to does to the data, in place)
    m = make()
    y = m(torch.randn(2, 4, requires_grad=True)).sum()
    m.to(torch.float64)
    if fails:
        with pytest.raises(RuntimeError, match="expected scalar type Float but found Double"):
            y.backward()
    else:
        y.backward()
        assert m.weight.grad is not None


def _offloaded_after_forward(norm: bool, by_data: bool) -> object:
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        m = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4) if norm else nn.Linear(4, 4)).to("cuda")
        y = m(torch.randn(2, 4, device="cuda")).sum()
        if by_data:
            for p in m[1].parameters():
                p.data = p.data.to("cpu")
        else:
            m[1].to("cpu")
        y.backward()
    return sim


@pytest.mark.parametrize("by_data", [False, True], ids=["Module.to", ".data ="])
def test_a_layer_norm_offloaded_before_the_backward_is_met_there(by_data: bool) -> None:
    sim = _offloaded_after_forward(True, by_data)
    ops = {(p.op, p.found, p.expected) for p in sim.problems}  # type: ignore[attr-defined]
    assert ops == {("aten.native_layer_norm_backward.default", "cpu", "cuda:0")}, ops
    if not by_data:  # (a .data swap of a twin is the twin itself: the message needs no story)
        assert any("an op saved it for the backward on cuda:0" in p.message for p in sim.problems)  # type: ignore


def test_a_linear_offloaded_before_the_backward_is_quiet() -> None:
    assert _offloaded_after_forward(False, False).ok  # type: ignore[attr-defined]


class _Block(nn.Module):
    def __init__(self, norm: bool) -> None:
        super().__init__()
        self.norm, self.ff = nn.LayerNorm(16) if norm else nn.Identity(), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.ff(self.norm(x)))


class _Net(nn.Module):
    def __init__(self, norm: bool) -> None:
        super().__init__()
        self.proj_in, self.proj_out = nn.Linear(8, 16), nn.Linear(16, 8)
        self.blocks = nn.ModuleList(_Block(norm) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj_in(x)
        for b in self.blocks:
            h = b(h)
        return self.proj_out(h)


@pytest.mark.parametrize("norm", [True, False], ids=["layer norm", "linear only"])
def test_diffusers_group_offloading_and_a_training_step(norm: bool) -> None:
    hooks = pytest.importorskip("diffusers.hooks")
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        model = _Net(norm)
        hooks.apply_group_offloading(model, onload_device=torch.device("cuda"), offload_device=torch.device("cpu"),
                                     offload_type="block_level", num_blocks_per_group=1)
        x = torch.randn(2, 8, device="cuda")
        (model(x) - x).square().mean().backward()
    if not norm:
        assert sim.ok, sim.problems
        return
    [weight, *_] = sim.problems
    assert weight.op == "aten.native_layer_norm_backward.default" and weight.path.endswith(".norm.weight")
    assert (weight.found, weight.expected) == ("cpu", "cuda:0")
    assert "an op saved it for the backward on cuda:0, and `ModuleGroup._offload_to_memory` of " \
        "diffusers.hooks.group_offloading (line " in weight.message, weight.message
    assert "then moved its data to cpu in place" in weight.message, weight.message
    # never a move of the weight (the offloading moves it again after every forward): the offloading is the fix
    [fix] = sim.fixes
    norm = weight.path.rpartition(".")[0]
    assert fix.code.startswith(f"# {norm}: `ModuleGroup._offload_to_memory` of diffusers.hooks.group_offloading")
    assert "do not offload modules that are trained" in fix.code and not fix.proven
    assert fix.tried.startswith("not re-run: the move is the offloading's own"), fix.tried
