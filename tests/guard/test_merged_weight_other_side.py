"""A LoRA merged into one layer of a bfloat16 model whose merged weight came out float16 (a GGUF dequantization
returns float16; the merge keeps ``w.dtype``): that one weight holds most of the model's elements, so a vote by size
says "the rest of the model is float16". Casting the bfloat16 layers to float16 then fails the whole forward (the
caller's input is bfloat16); guard's fix is the other side — the merged layer cast to bfloat16 — proven by the same
re-run, in explain and strict; never ``model[0].to(torch.float16)``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor


def _merged(dtype: torch.dtype) -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Linear(64, 64, bias=False), nn.SiLU(), nn.Linear(64, 16))
    model.to(torch.bfloat16)
    w = torch.randn(64, 64, dtype=dtype)  # the merge's result, in the dequantizer's dtype
    model[1].weight = nn.Parameter(w + (torch.randn(64, 4) @ torch.randn(4, 64)).to(w.dtype) * 0.01,
                                   requires_grad=False)
    return model


@pytest.mark.parametrize("mode", ["explain", "strict"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_the_merged_layer_is_cast_back_not_the_rest_of_the_model(mode: str, dtype: torch.dtype) -> None:
    model = _merged(dtype)
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(torchdoctor.PlacementError) as info, torch.no_grad(), torchdoctor.guard(model, mode=mode):
        model(torch.randn(1, 8, 16, dtype=torch.bfloat16))
    text = str(info.value)
    fix = info.value.fix or ""
    # a policy that reads the bfloat16 layers as the model's dtype names the weight itself; one that votes by size
    # says "the rest is float16", and the failed re-run of that cast turns the fix to the other side
    assert fix in ("model[1].to(torch.bfloat16)", "model[1].weight.data = model[1].weight.data.to(torch.bfloat16)"), text
    assert "model[0].to(" not in fix and "model[3].to(" not in fix, text
    if fix == "model[1].to(torch.bfloat16)":
        assert f"culprit `1`: every tensor in it is {name} while the rest of the model is bfloat16 (1 tensor: " \
               "1.weight; fewer tensors, though larger: the bfloat16 side is the model's dtype)" in text, text
        assert "fix proven: the whole forward runs again on a copy of the model with `1` -> bfloat16" in text, text
    else:
        assert "fix proven: the whole forward runs again on a copy of the model with 1.weight -> bfloat16" in text, text
    assert model[1].weight.dtype == dtype  # read-only
    exec(fix, {"model": model, "torch": torch})  # the fix, applied: the same call runs
    with torch.no_grad(), torchdoctor.guard(model, mode=mode):
        assert model(torch.randn(1, 8, 16, dtype=torch.bfloat16)).dtype == torch.bfloat16
