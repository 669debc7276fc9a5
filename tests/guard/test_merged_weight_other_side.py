"""A LoRA merged into one layer of a bfloat16 model whose merged weight came out float16 (a GGUF dequantization
returns float16; the merge keeps ``w.dtype``): that one weight holds most of the model's elements, but it is frozen
with no adapter trained in its layer, so it does not speak for the model as a frozen base would; a vote by size
would say "the rest of the model is float16", and casting the bfloat16 layers to float16 fails the whole forward
(the caller's input is bfloat16). guard's fix is the merged weight cast to bfloat16, proven by a whole-forward
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
    with pytest.raises(torchdoctor.PlacementError) as info, torch.no_grad(), torchdoctor.guard(model, mode=mode):
        model(torch.randn(1, 8, 16, dtype=torch.bfloat16))
    text, fix = str(info.value), info.value.fix or ""
    # the model's own census: a frozen weight with no adapter trained in its layer is no frozen base, so the
    # bfloat16 layers are the model's dtype and the merged weight is the culprit
    assert "culprit 1.weight" in text and "(expected bfloat16)" in text and "expected float16" not in text, text
    assert "fix proven: the whole forward runs again on a copy of the model with 1.weight -> bfloat16" in text, text
    assert fix == "model[1].weight.data = model[1].weight.data.to(torch.bfloat16)", text
    assert "model[0]" not in fix and "model[3]" not in fix, text
    assert model[1].weight.dtype == dtype  # read-only
    exec(fix, {"model": model, "torch": torch})  # the fix, applied: the same call runs
    with torch.no_grad(), torchdoctor.guard(model, mode=mode):
        assert model(torch.randn(1, 8, 16, dtype=torch.bfloat16)).dtype == torch.bfloat16
