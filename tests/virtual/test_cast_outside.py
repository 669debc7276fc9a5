"""A cast outside any module that sets a dtype (an optimizer's ``update.float()``, NorMuon#4) is the maker of what
it feeds: named at its line, the fix aimed there, not at the bfloat16 ``zeros_like`` the state was made with."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


def zeropower(g: torch.Tensor) -> torch.Tensor:
    return (g / (g.norm() + 1e-7)).float()  # the explicit upcast


def app(m: nn.Module) -> torch.Tensor:
    m.to("cuda:0", torch.bfloat16)
    m(torch.randn(2, 8, device="cuda:0", dtype=torch.bfloat16)).square().mean().backward()
    p = m.weight
    state = torch.zeros_like(p[:, :1])  # bfloat16, as p
    with torch.no_grad():
        v = zeropower(p.grad).square().mean(dim=-1, keepdim=True)
        state.lerp_(v, 0.05)
    return state


def test_the_float_cast_is_the_maker_not_the_zeros_like() -> None:
    report = torchdoctor.simulate(nn.Linear(8, 8, bias=False), device="cuda:0", dtype=torch.bfloat16, call=app)
    assert len(report.problems) == 1
    msg, line = report.problems[0].message, zeropower.__code__.co_firstlineno + 1
    assert f"`float()` at " in msg and f"test_cast_outside.py:{line} " in msg, msg
    assert "zeros_like" not in msg and "zeros_like" not in str(report)
