"""A block swap (forward pre/post hooks that move a block in and out, a LoRA trainer's) whose blocks are frozen: the
backward still reads a frozen layer norm's weight, because the gradient of the trained adapters before it flows
back through the layer. The note says so — bring the block back before its backward, or offload after it — and
never "do not offload modules that are trained" (nothing in that block is trained); a trained block keeps that
advice. Neither is a move of the block (the swap moves it again after every forward)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor


class _Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm, self.ff = nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(self.norm(x))


class _LoRA(nn.Module):
    def __init__(self, base: nn.Linear) -> None:
        super().__init__()
        self.base, self.down, self.up = base, nn.Linear(base.in_features, 2, bias=False), \
            nn.Linear(2, base.out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.up(self.down(x))


def _swap_in(m: nn.Module, args: object) -> None:
    m.to("cuda")


def _swap_out(m: nn.Module, args: object, out: object) -> None:
    m.to("cpu")


def _step(net: nn.Module, frozen: bool) -> None:
    net.to("cuda")
    if frozen:  # a LoRA trainer: the base weights frozen, adapters trained in every block
        net.requires_grad_(False)
        for b in net:
            b.ff = _LoRA(b.ff).to("cuda")
    for b in list(net)[-2:]:
        b.to("cpu")
        b.register_forward_pre_hook(_swap_in)
        b.register_forward_hook(_swap_out)
    net(torch.randn(2, 8, device="cuda")).square().mean().backward()


@pytest.mark.parametrize("frozen", [True, False], ids=["frozen base + LoRA", "trained"])
def test_a_swapped_block_the_backward_reads_is_told_by_whether_it_is_trained(frozen: bool) -> None:
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        _step(nn.Sequential(*(_Block(8) for _ in range(3))), frozen)
    assert {p.op for p in sim.problems} == {"aten.native_layer_norm_backward.default"}, sim.problems
    notes = [f for f in sim.fixes if f.code.startswith("# ")]
    assert len(notes) == len(sim.fixes) >= 1, sim.fixes
    code = notes[0].code
    assert "`_swap_out` at " in code and "test_swap_frozen.py:40 " in code, code
    assert "moved its parameters to cpu after the forward" in code, code
    if frozen:
        assert "they are frozen, but the backward reads them to carry the gradient through this layer to the " \
            "trained ones before it: bring them back to cuda:0 before its backward (a " \
            "register_full_backward_pre_hook that moves the module in" in code, code
        assert "do not offload modules that are trained" not in code, code
    else:
        assert "do not offload modules that are trained" in code and "they are frozen" not in code, code
    assert not notes[0].proven and notes[0].tried.startswith("not re-run: the move is the offloading's own")


def test_simulate_says_the_same_and_moves_nothing() -> None:
    report = torchdoctor.simulate(nn.Sequential(*(_Block(8) for _ in range(3))), device="cuda",
                                  call=lambda net: _step(net, True))
    assert report.problems and "they are frozen, but the backward reads them" in (report.fix or ""), report
    assert "torchdoctor.move(" not in (report.fix or "") and ".data = " not in (report.fix or ""), report.fix
