"""float8 weights of a layer that scales them per call (ComfyUI's fp8 Flux on a Mac) moved to mps, which cannot hold
float8: the fix casts every float8 tensor of the model to bfloat16 before the move (bfloat16 holds every float8
value), proven by a re-run; before, simulate said "no fix found: the model is on mps:0 already" (hunt of the
twenty-sixth session, c14)."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


class FP8Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.to(x.dtype) * self.scale_weight.to(x.dtype)
        return nn.functional.linear(x, w, self.bias.to(x.dtype))


def _model(n: int) -> nn.Sequential:
    m = nn.Sequential(*[FP8Linear(8, 8) for _ in range(n)])
    for layer in m:
        layer.weight.data = layer.weight.data.to(torch.float8_e4m3fn)
        layer.register_buffer("scale_weight", torch.tensor(1.0))
    return m


def test_float8_weights_mps_cannot_hold_are_cast_before_the_move() -> None:
    m = _model(2)
    r = torchdoctor.simulate(m, (torch.randn(2, 8, dtype=torch.bfloat16),), "mps")
    assert r.problems and all(p.kind == "unsupported_dtype" for p in r.problems)
    [fix] = r.fixes
    assert fix.code.startswith("model[0].weight.data = model[0].weight.data.to(torch.bfloat16)  # mps cannot hold "
                               "float8"), fix.code
    assert "model[1].weight.data = model[1].weight.data.to(torch.bfloat16)" in fix.code
    assert fix.proven, fix.tried
    assert m[0].weight.dtype == torch.float8_e4m3fn  # simulate changed nothing


def test_many_float8_weights_are_cast_in_one_loop() -> None:
    r = torchdoctor.simulate(_model(6), (torch.randn(2, 8, dtype=torch.bfloat16),), "mps")
    [fix] = r.fixes
    assert fix.code.startswith("for t in [*model.parameters(), *model.buffers()]:"), fix.code
    assert "t.data = t.data.to(torch.bfloat16)" in fix.code and fix.proven, fix.tried
