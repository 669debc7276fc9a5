"""One frozen weight a LoRA merge made in another dtype (a GGUF weight dequantized to float16, the merge keeping
``w.dtype``, ``requires_grad=False``) in a bfloat16 model whose other layers are trainable: the merged weight holds
most of the elements, but it is no frozen base with adapters trained on it (no trainable tensor sits in its layer), so
the model's own census speaks — the bfloat16 layers are the model's dtype and the merged weight is the culprit, cast
to bfloat16, proven; never "the rest of the model is float16" and never a cast of the bfloat16 layers. A frozen base
with its adapters in its own layer still speaks for the model (a bf16 base, fp32 ``lora_A``/``lora_B``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor


def _merge(layer: nn.Linear, dtype: torch.dtype) -> None:
    w = torch.randn(layer.out_features, layer.in_features, dtype=dtype)  # the dequantizer's output dtype
    layer.weight = nn.Parameter(w + (torch.randn(layer.out_features, 4) @ torch.randn(4, layer.in_features)).to(
        w.dtype) * 0.01, requires_grad=False)


def _fail(model: nn.Module, x: torch.Tensor, mode: str) -> torchdoctor.PlacementError:
    with pytest.raises(torchdoctor.PlacementError) as info, torch.no_grad(), torchdoctor.guard(model, mode=mode):
        model(x)
    return info.value


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_the_merged_weight_is_the_culprit_not_the_bf16_layers(mode: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Linear(64, 64, bias=False), nn.SiLU(), nn.Linear(64, 16))
    model.to(torch.bfloat16)
    _merge(model[1], torch.float16)
    err = _fail(model, torch.randn(1, 8, 16, dtype=torch.bfloat16), mode)
    text, fix = str(err), err.fix or ""
    assert "culprit 1.weight" in text and "f16[64,64]@cpu  (expected bfloat16)" in text, text
    assert "expected float16" not in text and "culprit 0." not in text, text
    assert "fix proven: the whole forward runs again on a copy of the model with 1.weight -> bfloat16" in text, text
    assert "model[1]" in fix and "torch.bfloat16" in fix and "model[0]" not in fix and "model[3]" not in fix, fix
    exec(fix, {"model": model, "torch": torch})  # noqa: S102  # the printed fix, applied: the call runs
    with torch.no_grad(), torchdoctor.guard(model, mode=mode):
        assert model(torch.randn(1, 8, 16, dtype=torch.bfloat16)).dtype == torch.bfloat16


class Block(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        a = nn.functional.scaled_dot_product_attention(self.q(h), self.k(h), self.v(h))
        return x + self.o(a)


def test_a_merged_projection_deep_in_a_block_is_named_in_strict() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block()).to(torch.bfloat16)
    big = nn.Linear(32, 32 * 40, bias=False)  # a merged weight larger than the rest of the model together
    big.weight = nn.Parameter(torch.randn(32 * 40, 32), requires_grad=False)
    model[1].o = nn.Sequential(nn.Linear(32, 32).to(torch.bfloat16), big, nn.Linear(32 * 40, 32).to(torch.bfloat16))
    err = _fail(model, torch.randn(2, 5, 32, dtype=torch.bfloat16), "strict")
    text, fix = str(err), err.fix or ""
    assert "1.o.1.weight" in text and "expected bfloat16" in text and "expected float32" not in text, text
    assert "torch.bfloat16" in fix and "model[1].o[1]" in fix and "model[0]" not in fix, fix


def test_a_frozen_base_with_its_adapters_still_speaks_for_the_model() -> None:
    class Lora(nn.Module):
        def __init__(self, d: int = 64, r: int = 4) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(d, d, dtype=torch.bfloat16), requires_grad=False)
            self.lora_A = nn.Parameter(torch.randn(r, d))
            self.lora_B = nn.Parameter(torch.randn(d, r))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.weight.t() + (x @ self.lora_A.t()) @ self.lora_B.t()

    err = _fail(Lora(), torch.randn(3, 64, dtype=torch.bfloat16), "explain")
    assert "expected bfloat16" in str(err) and "culprit lora_A" in str(err), str(err)
    assert "weight.data" not in (err.fix or "") or "lora" in (err.fix or ""), err.fix
