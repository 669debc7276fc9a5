"""Hunt V18 (session 15): experts the program keeps on the CPU itself, a forward pre-hook moving their inputs there
and a forward hook the output back, are placed on purpose: scan leaves them quiet, as it does an offload hook's
module; one hook alone (or none) is no such design, and the rest of the model is still judged."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


class _Moe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(4, 2)
        self.experts = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])


def _to_cpu(mod: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(a.to("cpu") for a in args)


def _back(mod: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> torch.Tensor:
    return out


def _paths(model: nn.Module) -> list[str]:
    return sorted(p.path for p in torchdoctor.scan(model, device="cuda:0").problems)


def test_experts_hooked_on_both_sides_are_quiet() -> None:
    m = _Moe()
    m.experts.register_forward_pre_hook(_to_cpu)
    m.experts.register_forward_hook(_back)
    assert _paths(m) == ["router.bias", "router.weight"]  # the router is on cpu against cuda:0: still a problem


def test_one_hook_alone_is_no_deliberate_offload() -> None:
    m = _Moe()
    m.experts.register_forward_pre_hook(_to_cpu)
    assert "experts.0.weight" in _paths(m)
    m2 = _Moe()
    m2.experts.register_forward_hook(_back)
    assert "experts.1.bias" in _paths(m2)
