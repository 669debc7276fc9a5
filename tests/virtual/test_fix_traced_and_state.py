"""Two fixes no move of the model gives. A traced module's tensor constant on the CPU: the traced code holds it, so
the fix registers it as a buffer before tracing (or traces on the device), never ``torchdoctor.move(model, ...)``,
and never names ``<constant>``. An optimizer state loaded on the CPU before the model's move: its own fix block,
naming the optimizer and the model as the program holds them, never "the tensors made on cpu"; that fix applied,
the run is quiet."""

from __future__ import annotations

import io

import torch
from torch import nn

import torchdoctor


class _Pos(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pos = torch.arange(4.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.pos


def test_a_traced_constant_is_registered_before_tracing_never_moved() -> None:
    x = torch.randn(2, 4)
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        traced = torch.jit.trace(_Pos(), x).to("cuda")
        traced(x.cuda())
    [fix] = sim.fixes
    assert "register it as a buffer" in fix.code and "trace on cuda:0" in fix.code, fix.code
    assert "torchdoctor.move" not in fix.code and "<constant>" not in fix.code and not fix.proven


def _resume(fixed: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    src = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(2, 4)).sum().backward()
    src.step()
    buf = io.BytesIO()
    torch.save(src.state_dict(), buf)
    buf.seek(0)
    opt.load_state_dict(torch.load(buf))
    if fixed:
        torchdoctor.move(model, "cuda:0", optimizer=opt)
    else:
        model.to("cuda")
    model(torch.randn(8, 4, device="cuda")).pow(2).mean().backward()
    opt.step()


def test_an_optimizer_state_left_on_the_cpu_has_its_own_fix_block() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        _resume(fixed=False)
    codes = [f.code for f in sim.fixes]
    assert any("torchdoctor.move(model, 'cuda:0', optimizer=opt)" in c for c in codes), codes
    assert not any("tensors made on" in c for c in codes), codes
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as clean:
        _resume(fixed=True)
    assert clean.ok, clean.problems
