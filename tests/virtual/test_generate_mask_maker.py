"""``generate()`` with an ``attention_mask`` made on the CPU (static cache): transformers derives ``position_ids``
from it on the CPU (``cumsum``, then ``masked_fill_`` with ``mask == 0``: two tensors, both the one factory's), so the
rotary embedding meets them there. The maker is the program's ``torch.ones`` at its line, never the library's
``masked_fill`` line; the mask made on the device is quiet."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import torchdoctor


def tiny() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))


def app(m: LlamaForCausalLM, mask_device: str) -> torch.Tensor:
    m.to("cuda:0").eval()
    ids = torch.randint(0, 64, (1, 5), device="cuda:0")
    mask = torch.ones(1, 5, dtype=torch.long, device=mask_device)
    return m.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2, do_sample=False,
                      cache_implementation="static", pad_token_id=0)


LINE = app.__code__.co_firstlineno + 3


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:  # generate() with a static cache sets it process-wide
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")


def test_the_masks_factory_is_the_maker() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        app(tiny(), "cpu")
    assert sim.problems, "a cpu attention_mask must be found"
    msg = sim.problems[0].message
    assert "made by torch.ones at " in msg and f"test_generate_mask_maker.py:{LINE})" in msg, msg
    assert "masked_fill" not in msg, msg


def test_the_mask_on_the_device_is_quiet() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        out = app(tiny(), "cuda:0")
    assert sim.problems == [] and out.device == torch.device("cuda:0")
