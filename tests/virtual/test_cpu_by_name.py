"""A tensor the program's line sends to the cpu by name (``torch.linspace(...).to("cpu")``, ``.cpu()``) is where
that line put it, even when it was on the cpu already: the line is named as the maker of its device, and the fix is
never a ``device=`` given to the factory, which the same line's move would undo (a scheduler keeping its sigmas on
the cpu, met by a stack on the GPU). Without the move, the factory is the maker and gets ``device=``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torchdoctor
from torchdoctor import PlacementError


def _error(kind: str) -> str:
    with pytest.raises(PlacementError) as err:
        with torchdoctor.virtual_devices("cuda:0"):
            if kind == "to":
                sigmas = torch.linspace(1.0, 0.05, 5).to("cpu")
            elif kind == "cpu":
                sigmas = torch.linspace(1.0, 0.05, 5).cpu()
            else:
                sigmas = torch.linspace(1.0, 0.05, 5)
            sample = torch.randn(2, device="cuda:0")
            rk = (sigmas[1] - sigmas[0]) / sigmas[2]
            torch.stack([rk, torch.ones((), device=sample.device)])
    return str(err.value)


@pytest.mark.parametrize("kind", ["to", "cpu"])
def test_a_move_to_the_cpu_by_name_is_the_maker_and_no_device_is_given_to_the_factory(kind: str) -> None:
    text = _error(kind)
    assert "a tensor made by torch.linspace" in text and "then moved by the line at " in text, text
    assert text.count("test_cpu_by_name.py:") >= 3  # the factory's line, the move's, the op's
    assert "pass device=" not in text and "device='cuda:0'" not in text, text
    assert "moves a tensor to cpu by name: move it to the device of the tensors it meets" in text
    assert "inside the forward" not in text


def test_without_the_move_the_factory_gets_its_device() -> None:
    text = _error("none")
    assert "then moved by the line" not in text
    assert "torch.linspace made it on cpu: pass device= (torch.linspace(..., device='cuda:0'))" in text, text


def test_the_factory_keeps_its_maker_after_transformers_from_pretrained(tmp_path: Path) -> None:
    """transformers' ``from_pretrained`` puts a wrapper in ``torch.linspace`` while it builds the model on meta; torch
    caches its set of factories the first time a device context asks, which is then, and keeps the wrapper for the
    rest of the process. A virtual run after it still names ``torch.linspace`` as the maker (CI stop 55: the suite's
    order put a ``from_pretrained`` first on one worker)."""
    import torch.utils._device as device_mod
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    device_mod._device_constructors.cache_clear()
    try:
        LlamaForCausalLM.from_pretrained(tmp_path)
        assert torch.linspace not in device_mod._device_constructors()  # torch's cache holds the wrapper
        text = _error("none")
        assert "torch.linspace made it on cpu: pass device= (torch.linspace(..., device='cuda:0'))" in text, text
        text = _error("to")
        assert "a tensor made by torch.linspace" in text and "then moved by the line at " in text, text
    finally:
        device_mod._device_constructors.cache_clear()
