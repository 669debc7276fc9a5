"""guard explain and strict: a DynamicCache filled in the model's own dtype and then written back by a function of the
program in another dtype (a KV-cache compressor whose helper returns ``.half()``, nexusquant PR #10): the off
dtype came from that writeback — the program's line that handed the cache over and the cast inside the function are
named — never "filled ... in float32" of a prefill that was bfloat16."""

from __future__ import annotations

import warnings

import pytest
import torch

import torchdoctor


def _llama() -> tuple[torch.nn.Module, object]:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval(), transformers.DynamicCache(config=cfg)


def _rounded(t: torch.Tensor) -> torch.Tensor:
    return (t * 64).round().div(64).half()  # stored small


def compress_half(cache: object) -> None:
    for layer in cache.layers:  # type: ignore[attr-defined]
        layer.keys, layer.values = _rounded(layer.keys), _rounded(layer.values)


def compress_float(cache: object) -> None:
    for layer in cache.layers:  # type: ignore[attr-defined]
        layer.keys, layer.values = layer.keys.to(torch.float32), layer.values.to(torch.float32)


@pytest.mark.parametrize("mode", ["explain", "strict"])
@pytest.mark.parametrize(("compress", "cast", "then"), [
    (compress_half, "return (t * 64).round().div(64).half()  # stored small",
     "the model's new entries joined to float16 ones promote them to float32"),
    (compress_float, "layer.keys, layer.values = layer.keys.to(torch.float32), layer.values.to(torch.float32)",
     "which float32 is")])
def test_the_writeback_is_where_the_cache_s_dtype_came_from(compress: object, cast: str, then: str, mode: str) -> None:
    model, cache = _llama()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model(torch.tensor([[1, 5, 7, 9]]), past_key_values=cache)
        compress(cache)  # type: ignore[operator]
        with pytest.raises(torchdoctor.PlacementError) as info, torchdoctor.guard(model, mode=mode):
            model(torch.tensor([[11, 12]]), past_key_values=cache)
    text = str(info.value)
    assert "`cache` was filled at " in text and "(`model(torch.tensor([[1, 5, 7, 9]]), past_key_values=cache)`)\n" \
        in text, text
    name = compress.__name__  # type: ignore[attr-defined]
    assert f"`cache` was written back at test_held_cache_writeback.py:" in text, text
    assert f"(`compress(cache)  # type: ignore[operator]`) after it was filled: `{name}` casts its tensors at " \
        f"test_held_cache_writeback.py:" in text and f"(`{cast}`)" in text and then in text, text
    assert "past_key_values=cache)`), in float32" not in text, text
    assert "fix proven" in text, text
