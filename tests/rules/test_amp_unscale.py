"""GradScaler over bfloat16 gradients: CUDA's unscale kernel has float16 and float32 only (pytorch#127176,
LMD0311/HERMES#12, huggingface/trl#4901), while the CPU kernel takes bfloat16, so a virtual run reports it at the
op, never an all-clear (hunt U16); float32 weights under bf16 autocast with a scaler stay quiet."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


def _step(dtype: torch.dtype) -> torchdoctor.VirtualSession:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1)).to("cuda:0", dtype)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(torch.randn(4, 8, device="cuda:0", dtype=dtype)).float().square().mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return sim


def test_the_cpu_kernel_takes_what_cuda_refuses() -> None:  # why the rule is needed: the CPU run alone is quiet
    grads = [torch.ones(3, dtype=torch.bfloat16)]
    torch._amp_foreach_non_finite_check_and_unscale_(grads, torch.zeros(1), torch.ones(1))
    assert grads[0].dtype == torch.bfloat16


def test_bfloat16_gradients_unscaled_on_cuda_are_a_dtype_problem() -> None:
    sim = _step(torch.bfloat16)
    [p] = sim.problems
    assert (p.kind, p.found, p.op) == ("dtype", "bfloat16", "aten._amp_foreach_non_finite_check_and_unscale_.default")
    assert "GradScaler.unscale_ has no CUDA kernel for bfloat16" in p.message
    assert "bfloat16 needs no GradScaler" in p.message


def test_float32_weights_under_bf16_autocast_with_a_scaler_are_quiet() -> None:
    sim = _step(torch.float32)
    assert sim.ok and not sim.problems
