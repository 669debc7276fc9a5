"""A verb's own dtype switch keeps float8 storage (issue 41 point 3, hunt U19): ``simulate(model, dtype=bf16)`` on
a virtual device and on the CPU itself checks the float8 weights the program holds (its layer dequantizes them per
call), never a bf16 copy the switch made of them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor


class Fp8Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4).to(torch.float8_e4m3fn), requires_grad=False)
        self.scale = nn.Parameter(torch.ones(4, 1), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.dtype != torch.float8_e4m3fn:  # the switch cast the storage: a model the program never holds
            raise ValueError(f"checked a {self.weight.dtype} weight, not the float8 one")
        return x @ (self.weight.to(x.dtype) * self.scale.to(x.dtype)).t()


@pytest.mark.parametrize("device", ["cuda:0", "cpu"])
def test_float8_weights_are_checked_as_stored(device: str) -> None:
    m = Fp8Linear()
    r = torchdoctor.simulate(m, (torch.ones(2, 4),), device=device, dtype=torch.bfloat16)
    assert r.ok, str(r)
    assert m.weight.dtype == torch.float8_e4m3fn  # the user's model untouched
