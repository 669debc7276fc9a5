"""guard, explain and strict: an SDPA dtype failure whose float32 key / value come from an object the program holds
(a KV cache handed to the block as an argument, a dataclass of tensors, transformers' DynamicCache prompt cache
filled before the model's bf16 cast) names that object by the program's name for it, what gave it its dtype, and a
fix at the program's level proven at the failing call (``_guard/heldarg.py``)."""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdoctor

COMPUTE = torch.bfloat16


class _KV:
    def __init__(self, seq: int, dtype: torch.dtype) -> None:
        self.k = torch.zeros(2, 1, 2, seq, 4, dtype=dtype)
        self.v = torch.zeros_like(self.k)

    def insert(self, i: int, pos: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = k.shape[2]
        self.k[i, :, :, pos:pos + t] = k
        self.v[i, :, :, pos:pos + t] = v
        return self.k[i, :, :, :pos + t], self.v[i, :, :, :pos + t]


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24, bias=False)

    def forward(self, x: torch.Tensor, cache: _KV, i: int, pos: int) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (z.view(b, t, 2, 4).transpose(1, 2) for z in self.qkv(x).split(8, -1))
        k, v = cache.insert(i, pos, k, v)
        return F.scaled_dot_product_attention(q, k, v)


def _chat(model: nn.Module, device: torch.device) -> torch.Tensor:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # a rule of the program's own
    cache = _KV(4, dtype=dtype)
    return model(torch.randn(1, 3, 8, dtype=COMPUTE), cache, 0, 0)


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_plain_cache_argument_named_with_its_dtype_rule_and_fixed_there(mode: str) -> None:
    model = _Block().to(dtype=COMPUTE)
    with pytest.raises(torchdoctor.PlacementError) as info, torch.no_grad(), torchdoctor.guard(model, mode=mode):
        _chat(model, torch.device("cpu"))
    text = str(info.value)
    assert "`k` (a local of forward, a view of `cache.k`): f32[" in text
    assert "`cache` (a _KV, an argument of forward) holds `cache.k`, `cache.v` in float32" in text
    assert "the program holds it as `cache` of _chat, made at test_held_cache.py:" in text
    assert "`cache.k` made by `torch.zeros` at " in text and "the dtype `dtype` assigned at " in text
    assert "the model was cast with `COMPUTE` at test_held_cache.py:" in text
    assert "fix proven: `F.scaled_dot_product_attention(q, k, v)` at test_held_cache.py:" in text
    fix = info.value.fix or ""
    assert fix.startswith("dtype = COMPUTE  # test_held_cache.py:")
    patch = info.value.patch or ""
    assert '-    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32' in patch
    assert "+    dtype = COMPUTE  # a rule of the program's own" in patch


@dataclasses.dataclass
class _State:
    keys: torch.Tensor
    values: torch.Tensor


class _Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, *, state: _State) -> torch.Tensor:
        keys, values = state.keys, state.values
        return F.scaled_dot_product_attention(self.q(x), keys, values)


def test_dataclass_keyword_argument_cast_where_the_program_makes_it() -> None:
    model = _Attn().to(torch.bfloat16)
    x = torch.randn(1, 2, 8, dtype=torch.bfloat16)
    state = _State(torch.zeros(1, 3, 8), torch.zeros(1, 3, 8))
    with pytest.raises(torchdoctor.PlacementError) as info, torchdoctor.guard(model):
        model(x, state=state)
    text = str(info.value)
    assert "`keys` (a local of forward, `state.keys`): f32[1,3,8]" in text
    assert "`state` (a _State, an argument of forward) holds `state.keys`, `state.values` in float32" in text
    # the call reads `self.q(x)` (no torch function to re-run alone): the module is re-run on a copy instead
    assert "fix proven: _Attn runs again on a copy, given a copy of `state` with its float32 tensors -> " \
           "bfloat16" in text
    assert info.value.fix == "state.keys, state.values = state.keys.to(torch.bfloat16), state.values.to(" \
                             "torch.bfloat16)  # `state` holds float32 tensors: cast them once, where it is made"
    assert "+    state.keys, state.values = state.keys.to(torch.bfloat16)" in (info.value.patch or "")
    assert state.keys.dtype == torch.float32  # read-only: the program's object is untouched


def _llama() -> tuple[nn.Module, object]:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval(), transformers.DynamicCache(config=cfg)


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_dynamic_cache_filled_before_the_cast_named_and_cast_after_it(mode: str) -> None:
    model, prompt_cache = _llama()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model(torch.tensor([[1, 5, 7, 9]]), past_key_values=prompt_cache)
        model.to(torch.bfloat16)
        with pytest.raises(torchdoctor.PlacementError) as info, torchdoctor.guard(model, mode=mode):
            model(torch.tensor([[11, 12]]), past_key_values=copy.deepcopy(prompt_cache))
        text = str(info.value)
        assert "(a local of forward, `cache.layers[0].keys`): f32[1,2,6,8]" in text
        assert "(a DynamicCache, an argument of forward) holds `cache.layers[0].keys`" in text
        assert "the program hands it in as `past_key_values=copy.deepcopy(prompt_cache)` at test_held_cache.py:" in text
        assert "`prompt_cache` was filled at " in text and "before the model's cast at test_held_cache.py:" in text
        assert "(`model.to(torch.bfloat16)`): its tensors kept float32" in text
        assert "fix proven: `torch.nn.functional.scaled_dot_product_attention(" in text
        fix = info.value.fix or ""
        loop = "for layer in prompt_cache.layers: layer.keys, layer.values = layer.keys.to(torch.bfloat16), " \
               "layer.values.to(torch.bfloat16)"
        assert fix.startswith(loop + "  # fill `prompt_cache` after the model's cast, or cast it once")
        assert "+        " + loop in (info.value.patch or "")
        assert prompt_cache.layers[0].keys.dtype == torch.float32  # read-only
        exec(loop, {"prompt_cache": prompt_cache, "torch": torch})  # the fix, applied: the same call runs
        with torchdoctor.guard(model, mode=mode):
            out = model(torch.tensor([[11, 12]]), past_key_values=copy.deepcopy(prompt_cache))
    assert out.logits.dtype == torch.bfloat16


@pytest.mark.slow
def test_cpu_run_names_the_cache_and_its_dtype_rule(tmp_path: os.PathLike) -> None:
    script = os.path.join(tmp_path, "chat.py")
    with open(script, "w") as f:
        f.write(textwrap.dedent("""\
            import torch, torch.nn as nn, torch.nn.functional as F
            DT = torch.bfloat16
            class Cache:
                def __init__(self, dtype):
                    self.k = torch.zeros(1, 2, 4, 4, dtype=dtype)
            class Blk(nn.Module):
                def __init__(self):
                    super().__init__(); self.q = nn.Linear(4, 4)
                def forward(self, x, cache):
                    k = cache.k[:, :, :3]
                    return F.scaled_dot_product_attention(self.q(x), k, k)
            def main(where):
                dtype = torch.bfloat16 if where == "gpu" else torch.float32
                cache = Cache(dtype=dtype)
                return Blk().to(dtype=DT)(torch.randn(1, 2, 3, 4, dtype=DT), cache)
            main("cpu")
        """))
    exe = os.path.join(os.path.dirname(sys.executable), "torchdoctor")
    out = subprocess.run([exe, "run", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    text = out.stdout + out.stderr
    assert "`cache.k` made by `torch.zeros` at " in text and "chat.py:5 (`self.k = torch.zeros(" in text
    assert "chat.py:13 (`dtype = torch.bfloat16 if where == \"gpu\" else torch.float32`)" in text
    assert "fix proven: Blk runs again on a copy, given a copy of `cache` with its float32 tensors" in text
    assert "dtype = DT  # chat.py:13" in text
    assert "t = t.float()" not in text


class _Shared:
    def __init__(self) -> None:
        self.keys = torch.zeros(1, 3, 8)


SHARED = _Shared()


class _ReadsGlobal(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keys = SHARED.keys
        return F.scaled_dot_product_attention(self.q(x), keys, keys)


def test_global_object_the_forward_reads_is_named() -> None:
    model = _ReadsGlobal().to(torch.bfloat16)
    with pytest.raises(torchdoctor.PlacementError) as info, torchdoctor.guard(model, mode="strict"):
        model(torch.randn(1, 2, 8, dtype=torch.bfloat16))
    text = str(info.value)
    assert "`keys` (a local of forward, `SHARED.keys`): f32[1,3,8]" in text
    assert "`SHARED` (a _Shared, a global forward reads) holds `SHARED.keys` in float32" in text
    assert "`SHARED.keys` made by `torch.zeros` at " in text and ", with no dtype= (the default dtype)" in text


def test_dynamic_cache_of_another_architecture_with_eager_attention() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                  attn_implementation="eager")
    torch.manual_seed(0)
    model, prompt_cache = transformers.GPT2LMHeadModel(cfg).eval(), transformers.DynamicCache(config=cfg)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model(torch.tensor([[1, 5, 7, 9]]), past_key_values=prompt_cache)
        model.half()
        with pytest.raises(torchdoctor.PlacementError) as info, torchdoctor.guard(model):
            model(torch.tensor([[11, 12]]), past_key_values=copy.deepcopy(prompt_cache))
    text = str(info.value)  # the eager path: a matmul refuses the float32 key, not SDPA
    assert "dtype mismatch in `transformer.h.0.attn` (GPT2Attention): float32 where float16 was expected" in text
    assert "(a local of forward, `cache.layers[0].keys`): f32[1,4,6,8]" in text
    assert "before the model's cast at test_held_cache.py:" in text and "(`model.half()`)" in text
    assert "fix proven: `torch.matmul(query, key.transpose(-1, -2))` at modeling_gpt2.py:" in text
    assert (info.value.fix or "").startswith("for layer in prompt_cache.layers: layer.keys, layer.values = "
                                             "layer.keys.to(torch.float16), layer.values.to(torch.float16)")


class _Half:
    def __init__(self) -> None:
        self.k = torch.zeros(1, 3, 8, dtype=torch.float16)  # written out at the allocation


class _UsesHalf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, held: _Half) -> torch.Tensor:
        keys = held.k
        return F.scaled_dot_product_attention(self.q(x), keys, keys)


def test_dtype_written_at_the_allocation_replaced_by_the_models_name() -> None:
    model = _UsesHalf().to(dtype=COMPUTE)
    with pytest.raises(torchdoctor.PlacementError) as info, torchdoctor.guard(model):
        model(torch.randn(1, 2, 8, dtype=COMPUTE), _Half())
    text = str(info.value)
    assert "dtype mismatch in `<root>` (_UsesHalf): float16 where bfloat16 was expected" in text
    assert "`held.k` made by `torch.zeros` at " in text and ", the dtype written there; the model was cast with " \
                                                             "`COMPUTE` at test_held_cache.py:" in text
    assert "fix proven: _UsesHalf runs again on a copy, given a copy of `held` with its float16 tensors" in text
    assert (info.value.fix or "").startswith("self.k = torch.zeros(1, 3, 8, dtype=COMPUTE)  # test_held_cache.py:")
    assert "+        self.k = torch.zeros(1, 3, 8, dtype=COMPUTE)  # written out at the allocation" in \
        (info.value.patch or "")
