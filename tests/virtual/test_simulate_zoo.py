"""Every zoo model runs clean on virtual cuda:1, xpu:0 and mps, in float32 and bfloat16, with and without peft LoRA,
and the user's object is bit-for-bit unchanged afterwards; a few more architectures built from configs too."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from support import zoo
from support.helpers import assert_unchanged
from torch import nn

import torchdoctor

DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
DEVICES = pytest.mark.parametrize("device", ["cuda:1", "xpu:0", "mps"])


@DTYPES
@DEVICES
@pytest.mark.parametrize("name", zoo.NAMES)
def test_zoo_model_runs_clean(name: str, device: str, dtype: torch.dtype) -> None:
    built = zoo.build(name, dtype)
    target = built.target()
    report = assert_unchanged(built.obj, torchdoctor.simulate, target, device=device, dtype=dtype)
    assert report.ok, "\n".join(str(p) for p in report.problems)
    assert report.ops > 0 and report.stopped is None


def _add_lora(obj: Any, fp32_adapters: bool) -> int:
    """peft LoRA on every ``nn.Linear`` (and GPT-2 ``Conv1D``) but ``lm_head`` of each module of ``obj`` (a pipeline's components too):
    adapters in the base dtype, as diffusers' ``add_adapter`` makes them, or float32 over a low-precision base, as
    ``get_peft_model`` makes them (``autocast_adapter_dtype=True``). Returns the number of adapted layers."""
    from peft import LoraConfig, inject_adapter_in_model
    from peft.tuners.tuners_utils import cast_adapter_dtype

    roots = [obj] if isinstance(obj, nn.Module) else [v for v in vars(obj).values() if isinstance(v, nn.Module)]
    count = 0
    for root in roots:
        names = [n for n, m in root.named_modules() if n and not n.endswith("lm_head") and (
            isinstance(m, nn.Linear) and not hasattr(m, "base_layer") or type(m).__name__ == "Conv1D")]  # GPT-2
        if not names:
            continue
        pattern = "^(?:" + "|".join(re.escape(n) for n in names) + ")$"
        torch.manual_seed(1)
        config = LoraConfig(r=4, lora_alpha=8, target_modules=pattern, lora_dropout=0.0, init_lora_weights=False)
        inject_adapter_in_model(config, root)
        if fp32_adapters:
            cast_adapter_dtype(root, "default", autocast_adapter_dtype=True)
        root.eval()
        count += len(names)
    return count


@DTYPES
@DEVICES
@pytest.mark.parametrize("name", [n for n in zoo.NAMES if "lora" not in n])  # the lora entries: above
def test_zoo_model_with_lora_runs_clean(name: str, device: str, dtype: torch.dtype) -> None:
    built = zoo.build(name, dtype)
    assert _add_lora(built.obj, fp32_adapters=built.kind == "transformers") > 0
    # dtype=None: the model is built in `dtype` already, and fp32 adapters over a bf16 base stay as peft made them
    report = assert_unchanged(built.obj, torchdoctor.simulate, built.target(), device=device)
    assert report.ok, "\n".join(str(p) for p in report.problems)
    assert report.ops > 0 and report.stopped is None


# --- more architectures, built from configs (nothing downloaded) -------------------------------------------------

_LLAMA_LIKE = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
_MORE: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(_LLAMA_LIKE, head_dim=16)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(_LLAMA_LIKE, head_dim=16, moe_intermediate_size=16,
                                                                 num_experts=4, num_experts_per_tok=2)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(_LLAMA_LIKE, head_dim=16, sliding_window=4)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(_LLAMA_LIKE, head_dim=16, sliding_window=4)),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(
        _LLAMA_LIKE, moe_intermediate_size=16, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
        first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=16, n_group=1, topk_group=1)),
}


def _causal_lm(name: str, dtype: torch.dtype) -> tuple[nn.Module, dict[str, Any]]:
    import transformers

    config_cls, model_cls, cfg = _MORE[name]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**cfg)).to(dtype).eval()
    return model, {"input_ids": torch.randint(3, 100, (1, 8), generator=torch.Generator().manual_seed(0))}


def _sd3(dtype: torch.dtype) -> tuple[nn.Module, dict[str, Any]]:
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(0)
    model = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8,
                                  num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16,
                                  pooled_projection_dim=16, out_channels=4, pos_embed_max_size=16).to(dtype).eval()
    return model, {"hidden_states": torch.randn(1, 4, 8, 8, dtype=dtype),
                   "encoder_hidden_states": torch.randn(1, 6, 16, dtype=dtype),
                   "pooled_projections": torch.randn(1, 16, dtype=dtype), "timestep": torch.tensor([1.0])}


@DEVICES
@pytest.mark.parametrize("lora", [False, True], ids=["plain", "lora"])
@pytest.mark.parametrize("name", [*_MORE, "sd3", "flux"])
def test_more_architectures_run_clean_in_bf16(name: str, lora: bool, device: str) -> None:
    bf16 = torch.bfloat16
    if name == "sd3":
        model, inputs = _sd3(bf16)
    elif name == "flux":
        built = zoo.build("flux", bf16)
        model, inputs = built.obj, built.inputs
    else:
        model, inputs = _causal_lm(name, bf16)
    if lora:
        assert _add_lora(model, fp32_adapters=name in _MORE) > 0
    report = assert_unchanged(model, torchdoctor.simulate, model, inputs, device=device, dtype=None if lora else bf16)
    assert report.ok, "\n".join(str(p) for p in report.problems)
    assert report.stopped is None


@pytest.mark.parametrize("device", ["cuda:1", "mps"])
def test_t5_generate_with_cpu_data(device: str) -> None:
    model = zoo.build("t5", torch.bfloat16).obj
    ids = torch.randint(3, 100, (1, 8), generator=torch.Generator().manual_seed(0))
    out: list[tuple[int, ...]] = []

    def run(m: Any) -> None:
        m.to(device)
        out.append(tuple(m.generate(ids.to(device), max_new_tokens=3, do_sample=False).shape))

    report = assert_unchanged(model, torchdoctor.simulate, model, device=device, data="cpu", call=run)
    assert report.ok, report.problems
    assert out and out[0][0] == 1 and 2 <= out[0][1] <= 4  # decoder start + up to 3 new tokens
