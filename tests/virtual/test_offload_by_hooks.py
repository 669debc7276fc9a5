"""Experts kept on the CPU on purpose, run there through the program's own hooks (a pre-hook moving every tensor
argument to the CPU, a forward hook moving the output back; vllm#15196 fixed) in a real Qwen3-MoE: a deliberate
placement, quiet, never "not moved". With a pre-hook that moves only the hidden states the router's outputs reach
the experts on the GPU: found inside the experts, never blamed on their weights as "not moved"."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

import torchdoctor


def every_argument(mod: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.to("cpu") if torch.is_tensor(a) else a for a in args)


def first_argument(mod: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return (args[0].to("cpu"), *args[1:])


def back(mod: Any, args: Any, out: torch.Tensor) -> torch.Tensor:
    return out.to("cuda:0")


def build() -> Qwen3MoeForCausalLM:
    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8, num_experts=4,
                         num_experts_per_tok=2, decoder_sparse_step=1, max_position_embeddings=64)
    return Qwen3MoeForCausalLM(cfg).eval()


def app(m: Qwen3MoeForCausalLM, pre: Any) -> torch.Tensor:
    m.to("cuda:0", torch.bfloat16)
    for layer in m.model.layers:
        experts = layer.mlp.experts
        experts.to("cpu")
        experts.register_forward_pre_hook(pre)
        experts.register_forward_hook(back)
    with torch.no_grad():
        return m(torch.randint(0, 64, (1, 6), device="cuda:0")).logits


@pytest.mark.parametrize("verb", ["simulate", "virtual_devices"])
def test_experts_offloaded_by_the_programs_hooks_are_quiet(verb: str) -> None:
    if verb == "simulate":
        assert torchdoctor.simulate(build(), device="cuda:0", call=lambda m: app(m, every_argument)).ok
        return
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        out = app(build(), every_argument)
    assert sim.problems == [] and out.device == torch.device("cuda:0")


def test_a_hook_that_leaves_the_router_outputs_on_the_gpu_is_found_in_the_experts() -> None:
    report = torchdoctor.simulate(build(), device="cuda:0", call=lambda m: app(m, first_argument))
    assert not report.ok
    assert "not moved" not in str(report)
    first = report.problems[0]
    assert first.module_path == "model.layers.0.mlp.experts" and first.kind == "device", str(report)
    assert "is on cuda:0" in first.message, first.message
