"""Every tensor of a tuple result records where it was made (a layer norm's ``(out, mean, rstd)``): a text encoder's
last hidden state, made by its final norm, names that norm when it reaches another component's failing op."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


def test_a_layer_norm_output_knows_its_maker() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        norm = nn.LayerNorm(8).to("cuda:0", torch.float16)
        out = norm(torch.randn(2, 8, device="cuda:0", dtype=torch.float16))
        made = out._td_origin
    assert sim.ok
    assert made is not None and "native_layer_norm" in str(made.op)
    assert any(p.endswith("weight") for p in made.paths), made.paths
