"""Issue 41 points 3 and 4 on more shapes than the first ones: transformers 5 rotary embeddings of several families
(and a dynamic rope, whose decorator moves ``original_inv_freq``) left on the cpu beside a model on a GPU are quiet in
scan and in the virtual run, by their forwards' code; uint8 codes in a plain ``Embedding`` are named; float8 weights a
layer dequantizes per call through a helper function are quiet."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor

BF16 = torch.bfloat16


def _families() -> dict[str, tuple[Any, Any, dict[str, Any]]]:
    import transformers as tf

    return {
        "llama-dynamic": (tf.LlamaConfig, tf.LlamaForCausalLM, dict(num_key_value_heads=2, rope_parameters={
            "rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, dict(num_key_value_heads=2)),
        "gpt_neox": (tf.GPTNeoXConfig, tf.GPTNeoXForCausalLM, {}),
        "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM, dict(num_key_value_heads=2, head_dim=16)),
    }


@pytest.mark.parametrize("family", ["llama-dynamic", "qwen2", "gpt_neox", "gemma2"])
def test_rotary_left_on_the_cpu_is_quiet_in_scan_and_in_the_run(family: str) -> None:
    config, model_class, kw = _families()[family]
    torch.set_default_dtype(BF16)  # as from_pretrained(dtype=bf16) builds it: inv_freq stays float32
    try:
        model = model_class(config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, **kw))
    finally:
        torch.set_default_dtype(torch.float32)
    ropes = [p for p, m in model.named_modules() if type(m).__name__.endswith("RotaryEmbedding")]
    assert ropes
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        model.to("cuda:0")
        for path in ropes:
            model.get_submodule(path).to("cpu")  # its forward moves inv_freq to the input's device on every call
        assert torchdoctor.scan(model).problems == ()
        assert torchdoctor.scan(model, device="cuda:0").problems == ()
        with torch.no_grad():
            model(torch.ones(1, 8, dtype=torch.long, device="cuda:0"))
        model.get_submodule(ropes[0]).register_buffer("stray", torch.ones(2, dtype=BF16))  # never moved by it
        assert [(p.kind, p.path) for p in torchdoctor.scan(model, device="cuda:0").problems] == [
            ("device", f"{ropes[0]}.stray")]
    assert [(p.kind, p.path) for p in sim.problems] == []


def test_uint8_codes_in_a_plain_embedding_are_named() -> None:
    m = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.Linear(8, 8)).to(BF16)
    m[0].weight = nn.Parameter(torch.randint(0, 255, (10, 8), dtype=torch.uint8), requires_grad=False)
    [p] = torchdoctor.scan(m).problems
    assert (p.path, p.kind, p.found, p.expected) == ("0.weight", "dtype", "uint8", "bfloat16")
    assert "Embedding's own forward computes with it as it is" in p.message


def dequantize_weight(w: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return w.to(dtype) * scale


class Float8Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 8).to(torch.float8_e4m3fn), requires_grad=False)
        self.weight_scale = nn.Parameter(torch.ones(8, 1), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, dequantize_weight(self.weight, self.weight_scale, x.dtype))


def test_float8_weights_a_layer_dequantizes_per_call_through_a_helper_are_quiet() -> None:
    m = nn.Sequential(nn.Linear(8, 8), Float8Linear(), nn.Linear(8, 8)).to(BF16)
    m[1].weight.data = torch.randn(8, 8).to(torch.float8_e4m3fn)  # Module.to cast the float8 codes: put back
    assert torchdoctor.scan(m).problems == ()
    assert m(torch.ones(1, 8, dtype=BF16)).dtype == BF16  # it really computes
    # the same layer whose own forward hands the float8 weight to F.linear as it is: named
    class Direct(Float8Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.linear(x, self.weight)

    d = nn.Sequential(nn.Linear(8, 8), Direct(), nn.Linear(8, 8)).to(BF16)
    d[1].weight.data = torch.randn(8, 8).to(torch.float8_e4m3fn)
    assert [(p.path, p.found) for p in torchdoctor.scan(d).problems] == [("1.weight", "float8_e4m3fn")]
