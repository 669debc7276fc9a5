"""A tensor a library's line makes with ``device=`` taken from what it is given (transformers' MoE experts:
``torch.arange(..., device=hidden_states.device)``) is never fixed by "pass device=" at that line, and a library's
own line is never edited by a diff: the fix is what the library's call receives (issue 41 point 1, hunt s15 V1:
Qwen3-MoE experts offloaded to the cpu with a pre-hook that moves only the hidden states)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

import torchdoctor


def only_hidden_to_cpu(mod: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return (args[0].to("cpu"), *args[1:])  # the router's indices and weights stay on the GPU


def back(mod: Any, args: Any, out: torch.Tensor) -> torch.Tensor:
    return out.to("cuda:0")


def app(m: Any) -> torch.Tensor:
    m.to("cuda:0", torch.bfloat16)
    for layer in m.model.layers:
        layer.mlp.experts.to("cpu")
        layer.mlp.experts.register_forward_pre_hook(only_hidden_to_cpu)
        layer.mlp.experts.register_forward_hook(back)
    with torch.no_grad():
        return m(torch.randint(0, 64, (1, 6), device="cuda:0")).logits


def test_a_library_line_that_follows_its_input_is_not_fixed_there() -> None:
    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8, num_experts=4,
                         num_experts_per_tok=2, decoder_sparse_step=1, max_position_embeddings=64)
    r = torchdoctor.simulate(Qwen3MoeForCausalLM(cfg).eval(), device="cuda:0", dtype=torch.bfloat16, call=app)
    assert not r.ok
    assert not any(f.diff and "site-packages" in f.diff for f in r.fixes)  # never an edit of the library
    made = [f for f in r.fixes if "torch.arange" in f.code]
    assert made and all("(a library's line) already makes its tensor on the device of what it is given" in f.code and
                        not f.proven and "pass device=" not in f.code for f in made), [f.code for f in r.fixes]
