"""A cast-only ``move`` is verified by a fresh walk against what its plan made (``Expect``) instead of a second
policy (issue 28): every result the fresh plan would refuse is still refused, with the fresh plan's own words.

``Expect.holds`` may only say "done" where a fresh plan finds nothing to do; where anything differs it says no and
the fresh plan names what was left. Models whose cast targets are re-read from the tensors' dtypes (peft adapters,
bitsandbytes layers) or that hold hooks, patched forwards or float8 storage get no ``Expect`` at all."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from support import zoo
from torch import nn

from torchdoctor import PlacementError
from torchdoctor._move import owners as _move_owners
from torchdoctor._move.apply import move
from torchdoctor._move.plan import build
from torchdoctor._walk import set_tensor, walk

BF16, F16, F32, F64 = torch.bfloat16, torch.float16, torch.float32, torch.float64


class Stuck(torch.Tensor):
    """A tensor subclass whose ``.to`` does nothing (as some third-party subclasses do)."""

    def to(self, *args: Any, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
        return self


def _containers() -> nn.Module:
    m = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    m.scale = torch.ones(4)
    m.table = {"a": torch.zeros(2), "ids": torch.arange(3)}
    m.blocks = [nn.Linear(2, 2)]
    m.register_buffer("cache", torch.zeros(3), persistent=False)
    return m


def _tied_gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=16)).eval()


def _t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    return T5ForConditionalGeneration(T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                               num_heads=2, decoder_start_token_id=0)).eval()


PLAIN = {"llama": zoo.tiny_llama, "unet": zoo.tiny_unet, "t5": _t5, "gpt2-tied": _tied_gpt2, "containers": _containers}


def _fresh_plan_empty(obj: Any, dtype: torch.dtype, keep_fp32: bool) -> bool:
    return not build(obj, None, dtype, keep_fp32).public()


def _sabotages(obj: Any) -> list[str]:
    """Paths of floating tensors to put back in another dtype, one at a time (a write that did not land)."""
    return [e.path for e in walk(obj).entries if e.alias_of is None and e.tensor.is_floating_point()]


def _revert(obj: Any, path: str, dtype: torch.dtype) -> None:
    e = next(x for x in walk(obj).entries if x.path == path)
    t = e.tensor
    if isinstance(t, nn.Parameter):
        t.data = t.data.to(dtype)
    else:
        set_tensor(e, t.to(dtype))


@pytest.mark.parametrize("name", sorted(PLAIN))
@pytest.mark.parametrize(("dtype", "keep_fp32"), [(BF16, True), (F16, True), (F16, False), (F64, True)])
def test_done_only_where_a_fresh_plan_finds_nothing(name: str, dtype: torch.dtype, keep_fp32: bool) -> None:
    obj = PLAIN[name]()
    expect = build(obj, None, dtype, keep_fp32).expect
    assert expect is not None, "an ordinary model is verified without a second policy"
    move(obj, dtype=dtype, keep_fp32=keep_fp32)
    assert expect.holds(obj) and _fresh_plan_empty(obj, dtype, keep_fp32)
    paths = _sabotages(obj)
    for path in paths[:: max(1, len(paths) // 12)]:  # a dozen spread over the model, each on a fresh copy
        other = PLAIN[name]()
        expect = build(other, None, dtype, keep_fp32).expect
        assert expect is not None
        move(other, dtype=dtype, keep_fp32=keep_fp32)
        was = next(e.tensor.dtype for e in walk(other).entries if e.path == path)
        _revert(other, path, F32 if was != F32 else F64)
        assert not _fresh_plan_empty(other, dtype, keep_fp32), path
        assert not expect.holds(other), f"{name}: {path} left behind but Expect says done"


def test_a_new_tensor_or_a_replaced_class_is_not_done() -> None:
    m = _containers()
    expect = build(m, None, BF16, True).expect
    assert expect is not None
    move(m, dtype=BF16)
    assert expect.holds(m)
    m[0].extra = torch.zeros(2, dtype=BF16)  # a path the plan never saw
    assert not expect.holds(m)
    del m[0].extra
    m.scale = m.scale.as_subclass(Stuck)  # another class at a planned path
    assert not expect.holds(m)


@pytest.mark.parametrize("make", [lambda: zoo.lora_llama(BF16), lambda: zoo.bnb_linear4bit()],
                         ids=["peft-adapters", "bitsandbytes-4bit"])
def test_adapters_and_kbit_layers_get_the_fresh_plan(make: Any) -> None:
    assert build(make(), None, F16, True).expect is None


def test_hooks_and_device_moves_get_the_fresh_plan() -> None:
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module

    m = nn.Sequential(nn.Linear(2, 2))
    assert build(m, torch.device("meta"), BF16, True).expect is None
    add_hook_to_module(m[0], AlignDevicesHook(execution_device="cpu"))
    assert build(m, None, BF16, True).expect is None


def test_a_cast_that_did_not_land_is_left_behind_cast_only() -> None:
    m = nn.Linear(2, 2)
    m.cache = torch.zeros(3).as_subclass(Stuck)
    with pytest.raises(PlacementError) as info:
        move(m, dtype=BF16)
    text = str(info.value)
    assert "left behind" in text and "cache  f32[3]@cpu -> bf16[3]@cpu" in text
    assert "rolled back" in text and m.weight.dtype == F32 and m.cache.dtype == F32


def test_a_parameter_write_that_did_not_land_is_left_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _move_owners.install

    def skipping(e: Any, *args: Any, **kwargs: Any) -> None:
        if e.path != "1.weight":  # an owner that silently keeps its old weight
            real(e, *args, **kwargs)

    monkeypatch.setattr(_move_owners, "install", skipping)
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    with pytest.raises(PlacementError, match="left behind") as info:
        # "exact" keeps the originals: every tensor goes through install (the lean cast of plain Parameters in
        # "auto" writes param.data itself; tests/move/test_lean_cast.py)
        move(m, dtype=BF16, rollback="exact")
    assert "1.weight  f32[2,2]@cpu -> bf16[2,2]@cpu" in str(info.value)
    assert all(p.dtype == F32 for p in m.parameters())
