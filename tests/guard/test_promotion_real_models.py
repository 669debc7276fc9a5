"""Issue 42 point 3 on real library models: a plain float32 tensor attribute in a bf16 transformers / diffusers model
promotes its output silently; strict names it by path with a proven fix, and the fix applied keeps the model's dtype."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor

BF = torch.bfloat16


class _Gained(nn.Module):
    """A layer wrapped with a gain kept as a plain tensor: ``Module.to`` never casts it."""

    def __init__(self, inner: nn.Module, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.inner = inner
        self.gain = torch.ones(shape)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.inner(x, *args, **kwargs) * self.gain


def _llama() -> Any:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.model.layers[0].mlp = _Gained(model.model.layers[0].mlp, (16,))
    return model.to(BF)


def _unet() -> Any:
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1,
                                 block_out_channels=(8,), down_block_types=("DownBlock2D",),
                                 up_block_types=("UpBlock2D",), norm_num_groups=4).eval()
    unet.conv_out = _Gained(unet.conv_out, (1, 1, 1, 1))
    return unet.to(BF)


def test_a_float32_gain_in_a_bf16_llama_is_stopped_at_the_promoting_mul_by_path() -> None:
    model = _llama()
    ids = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(0))
    with pytest.raises(torchdoctor.PlacementError) as info, torch.no_grad(), torchdoctor.guard(model, mode="strict"):
        model(ids)
    err = info.value
    assert "arg 1 (other) is float32 and promotes the model's bfloat16 to float32 silently" in str(err)
    assert [(p.path, p.found, p.expected) for p in err.problems] == [("model.layers.0.mlp.gain", "float32", "bfloat16")]
    assert err.fix == "model.model.layers[0].mlp.gain.data = model.model.layers[0].mlp.gain.data.to(torch.bfloat16)"
    assert err.proof is not None and err.proof.startswith("fix proven")
    gained = model.model.layers[0].mlp
    gained.gain = gained.gain.to(BF)  # the fix, applied
    with torch.no_grad(), torchdoctor.guard(model, mode="strict") as g:
        assert model(ids).logits.dtype == BF
    assert not g.problems


@pytest.mark.parametrize("mode", ["strict", "warn"])
def test_a_float32_gain_on_a_bf16_unets_output_is_named_by_path(mode: str) -> None:
    unet = _unet()
    x, t = torch.randn(1, 1, 8, 8, dtype=BF), torch.tensor([10])
    with torch.no_grad():
        assert unet(x, t).sample.dtype == torch.float32  # no error anywhere: only the output's dtype says it
    if mode == "strict":
        with pytest.raises(torchdoctor.PlacementError) as info, torch.no_grad(), torchdoctor.guard(unet, mode=mode):
            unet(x, t)
        problems, fix = info.value.problems, info.value.fix
    else:
        with pytest.warns(torchdoctor.PlacementWarning, match="conv_out"), torch.no_grad(), \
                torchdoctor.guard(unet, mode=mode) as g:
            assert unet(x, t).sample.dtype == BF  # aligned for the call
        problems, fix = g.problems, g.fixes[0].code
    assert [(p.path, p.found, p.expected) for p in problems] == [("conv_out.gain", "float32", "bfloat16")]
    assert fix == "model.conv_out.gain.data = model.conv_out.gain.data.to(torch.bfloat16)"
