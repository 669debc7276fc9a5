"""Every line that makes a tensor a device cannot hold is found in one run, not only the first: a rotary embedding
that makes its frequencies with ``torch.arange(..., dtype=torch.float64)`` and casts its positions with
``pos.to(torch.float64)`` on mps (meituan-longcat/LongCat-Image #21) has two such lines, each fixed at its own line.
The ops that then compute in float64 are those tensors' (one cause each), never a problem of their own."""

from __future__ import annotations

import os
import sys

import torch
import torch.nn as nn

import torchdoctor

HERE = os.path.relpath(__file__) if __file__.startswith(os.getcwd() + os.sep) else \
    os.sep.join(__file__.split(os.sep)[-2:])


def _rope(pos: torch.Tensor, dim: int) -> torch.Tensor:
    freqs = 1.0 / 10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64, device=pos.device) / dim)
    angles = torch.outer(pos.to(torch.float64), freqs)
    return angles.cos().float()


LINE = _rope.__code__.co_firstlineno + 1  # the arange's line; the cast is on the next


class _Rotary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cos = _rope(torch.arange(x.shape[0], device=x.device), 4)
        return self.proj(x) * cos


def test_both_float64_lines_of_one_rope_in_one_run() -> None:
    with torchdoctor.virtual_devices("mps", raise_on_exit=False) as sim:
        _rope(torch.arange(16, device="mps"), 8)
    line = LINE
    refused = [p for p in sim.problems if p.kind == "unsupported_dtype"]
    said = " | ".join(p.message for p in refused)
    assert f"torch.arange(dtype=float64, device='mps:0') at {HERE}:{line}:" in said, said
    assert f"moved to mps:0 as float64 (cast at {HERE}:{line + 1}): mps cannot hold float64" in said, said
    assert len(refused) == 2 and not any(p.message.startswith("aten.") for p in refused), said  # no op after them
    codes = " | ".join(f.code for f in sim.fixes)
    assert f"pass dtype=torch.float32 to torch.arange at {HERE}:{line}" in codes, codes
    assert f"{HERE}:{line + 1}: `angles = torch.outer(pos.to(torch.float64), freqs)` casts to float64" in codes, codes


def test_simulate_of_a_model_names_both_lines() -> None:
    model = _Rotary()
    report = torchdoctor.simulate(model, (torch.randn(3, 4),), device="mps")
    said = " | ".join(p.message for p in report.problems if p.kind == "unsupported_dtype")
    line = LINE
    assert f"at {HERE}:{line}:" in said and f"(cast at {HERE}:{line + 1})" in said, said



def test_an_op_a_card_has_no_kernels_for_names_its_operand_s_maker() -> None:
    import numpy as np

    with torchdoctor.virtual_devices("xpu", profile="arc", raise_on_exit=False) as sim:
        sig = torch.from_numpy(np.linspace(0, 1, 8)).to("xpu"); line = sys._getframe().f_lineno  # noqa: E702
        (sig * 2).sum()
    [p] = [p for p in sim.problems if p.kind == "unsupported_dtype"]
    assert "xpu cannot compute in float64" in p.message, p.message
    assert "; the operand is a tensor made by " in p.message and f"torch.from_numpy in code outside the model at " \
        f"{HERE}:{line}" in p.message, p.message
