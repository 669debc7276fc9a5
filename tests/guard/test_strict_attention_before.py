"""strict stops before ``scaled_dot_product_attention`` when query, key, value or the mask disagree in dtype or
device: its C++ code compares them before any aten op is dispatched, so the dispatch mode never sees the call.
The check is a thin ``torch.nn.functional.scaled_dot_product_attention`` while a strict session runs (no function
mode on every torch call: ``bench/guard.py``), put back when the session ends; agreeing operands, a boolean mask and
other threads pass straight through to torch's own function. A key or value held by an object the forward is handed
(a KV cache) is left to torch's check, whose explanation names the holder (``heldarg``)."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdoctor

_TORCH = F.scaled_dot_product_attention


class _Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x: torch.Tensor, cache_k: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = self.qkv(x).view(1, 4, 3, 8).unbind(2)
        return F.scaled_dot_product_attention(q, k if cache_k is None else cache_k, v, attn_mask=mask)


def _strict(m: nn.Module, *args: object) -> torchdoctor.PlacementError:
    with pytest.raises(torchdoctor.PlacementError) as info, torchdoctor.guard(m, mode="strict"):
        m(*args)
    assert F.scaled_dot_product_attention is _TORCH  # put back as the session ends, raised or not
    return info.value


def test_a_key_in_another_dtype_stops_strict_before_attention_runs() -> None:
    m = _Attn().to(torch.bfloat16)
    cache = torch.randn(1, 4, 8)  # a cache made in float32 next to a bf16 model
    err = _strict(m, torch.randn(1, 4, 8, dtype=torch.bfloat16), cache)
    assert err.__cause__ is None, err.__cause__  # raised before torch's own check, not explained after it
    text = str(err)
    assert text.startswith("dtype problem in `<root>` (_Attn) at aten.scaled_dot_product_attention.default: "
                           "arg 1 (key) is float32, expected bfloat16 like the query"), text
    assert "culprit cache_k (an argument of the _Attn call): f32[1,4,8]@cpu" in text, text
    assert "cache_k made by `torch.randn` at " in text and "fix proven" in text, text


def test_a_mask_on_another_device_stops_strict_before_attention_runs() -> None:
    m = _Attn().to(torch.bfloat16)
    mask = torch.zeros(4, 4, dtype=torch.bfloat16, device="meta")
    err = _strict(m, torch.randn(1, 4, 8, dtype=torch.bfloat16), None, mask)
    assert err.__cause__ is None and "at aten.scaled_dot_product_attention.default: arg 3 (attn_mask) is on meta" \
        in str(err), str(err)


@pytest.mark.parametrize("mask", [None, torch.ones(4, 4, dtype=torch.bool), torch.zeros(4, 4, dtype=torch.bfloat16)],
                         ids=["no mask", "bool mask", "mask in the query's dtype"])
def test_agreeing_operands_run_as_torch_runs_them(mask: torch.Tensor | None) -> None:
    m = _Attn().to(torch.bfloat16)
    x = torch.randn(1, 4, 8, dtype=torch.bfloat16)
    with torch.no_grad():
        want = m(x, None, mask)
        with torchdoctor.guard(m, mode="strict"):
            assert F.scaled_dot_product_attention is not _TORCH  # the thin check, while strict runs
            got = m(x, None, mask)
    assert torch.equal(got, want) and F.scaled_dot_product_attention is _TORCH


def test_another_thread_is_not_checked_by_this_threads_session() -> None:
    q = torch.randn(1, 4, 8, dtype=torch.bfloat16)
    seen: list[BaseException] = []

    def other() -> None:  # no guard in this thread: torch's own error, unexplained
        try:
            F.scaled_dot_product_attention(q, q.float(), q)
        except BaseException as exc:  # noqa: BLE001 - the test reads what was raised
            seen.append(exc)

    m = _Attn().to(torch.bfloat16)
    with torchdoctor.guard(m, mode="strict"):
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert len(seen) == 1 and type(seen[0]) is RuntimeError, seen
    assert "Expected query, key, and value to have the same dtype" in str(seen[0])


def test_a_cache_object_the_forward_is_handed_is_told_from_torchs_own_check() -> None:
    # a key held by an object (transformers' DynamicCache filled in float32): torch's check raises it, and the
    # explanation from its traceback names the holder and casts it once where the program made it (heldarg)
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=32,
                                  attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 32, (1, 5))
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values  # filled in float32
        model.to(torch.bfloat16)
        with pytest.raises(torchdoctor.PlacementError) as info, torchdoctor.guard(model, mode="strict"):
            model(ids[:, -1:], past_key_values=cache)
    assert F.scaled_dot_product_attention is _TORCH
    text = str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError), info.value.__cause__
    assert "`cache` (a DynamicCache, an argument of forward) holds `cache.layers[0].keys`" in text, text
    assert (info.value.fix or "").startswith("for layer in cache.layers: layer.keys, layer.values = "), info.value.fix
