"""An RMSNorm that upcasts its input (``x = x.float()``) and returns ``self.weight * x`` hands float32 to the next
bf16 layer: the line's value is cast back to the dtype of the module's own weight (``.to(self.weight.dtype)``), which
holds in any dtype the model is cast to, never to a dtype written out (``.to(torch.bfloat16)`` made the same model
fail in float32; hunt of the twenty-sixth session, c12)."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


class RMSNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * x


class Fixed(RMSNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (self.weight * x).to(self.weight.dtype)  # the printed fix


def test_the_promoted_line_is_cast_back_to_the_modules_own_dtype() -> None:
    model = nn.Sequential(RMSNorm(16), nn.Linear(16, 16)).to(torch.bfloat16)
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as s:
        model.to("cuda:0")(torch.randn(2, 16, dtype=torch.bfloat16, device="cuda:0"))
    [fix] = s.fixes
    assert "return (self.weight * x).to(self.weight.dtype)" in fix.code and fix.proven, fix.code
    assert "torch.bfloat16" not in fix.code.rpartition("there:")[2]
    for dtype in (torch.float32, torch.bfloat16):  # the fixed line, for real, in either dtype
        fixed = nn.Sequential(Fixed(16), nn.Linear(16, 16)).to(dtype)
        assert fixed(torch.randn(2, 16, dtype=dtype)).dtype == dtype
