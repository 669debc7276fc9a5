"""Tensors made from a model tensor before the model's cast (a KV cache filled in float32, then ``model.to(bf16)``)
meet the cast model: every model tensor is already what the run asks, so a move or cast of the model would change
nothing. The fix says to make them again after the cast, never a no-op ``torchdoctor.move(model, ...)``."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

import torchdoctor

_NOTE = "no move or cast of the model changes them now; make them again after the model's cast or move"


class _Attn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, cache: dict[str, torch.Tensor]) -> torch.Tensor:
        if "k" not in cache:
            cache["k"] = self.k(x)
        return F.scaled_dot_product_attention(self.q(x)[None], cache["k"][None], cache["k"][None])


def _codes(block: object) -> list[str]:
    return [f.code for f in block.fixes]  # type: ignore[attr-defined]


def test_a_cache_filled_before_the_cast_is_made_again_not_the_model_moved() -> None:
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False, select=False) as block:
        m, cache = _Attn().to("cuda"), {}
        x = torch.randn(4, 8, device="cuda")
        with torch.no_grad():
            m(x, cache)
            m.to(torch.bfloat16)
            m(x.to(torch.bfloat16), cache)
    [fix] = block.fixes
    assert _NOTE in fix.code and "made from k.bias" in fix.code and "bfloat16 on cuda:0" in fix.code, fix.code
    assert not fix.proven and "not re-run" in fix.tried
    assert not any("torchdoctor.move(" in c for c in _codes(block))


def test_a_transformers_prompt_cache_reused_after_the_cast() -> None:
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, attn_implementation="sdpa")
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False, select=False) as block:
        model = LlamaForCausalLM(cfg).eval().to("cuda")
        prompt_cache = DynamicCache(config=cfg)
        with torch.no_grad():
            model(torch.tensor([[1, 5, 7, 9]], device="cuda"), past_key_values=prompt_cache)  # filled in float32
            model.to(torch.bfloat16)
            model(torch.tensor([[1, 5, 7, 9, 11]], device="cuda"), past_key_values=copy.deepcopy(prompt_cache))
    assert block.error() is not None and "scaled_dot_product_attention" in str(block.error())
    assert any(_NOTE in c and "self_attn.k_proj" in c for c in _codes(block)), _codes(block)
    assert not any("torchdoctor.move(" in c for c in _codes(block)), _codes(block)
