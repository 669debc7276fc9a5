"""Pinned host memory in a virtual GPU run: a factory asked for ``pin_memory=True`` (what safetensors makes to load a
file straight onto a GPU) and ``t.pin_memory()`` are answered as a GPU machine answers them, where this CPU build
raises; the loaded values are the file's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import torchdoctor


def test_this_build_has_no_pinned_allocator() -> None:  # the reason the run has to answer
    with pytest.raises(RuntimeError, match="pin_memory=True requires a CUDA or other accelerator backend"):
        torch.empty(4, pin_memory=True)


def test_safetensors_loads_straight_to_the_virtual_gpu(tmp_path: Path) -> None:
    want = {"w": torch.randn(3, 4), "b": torch.arange(4, dtype=torch.bfloat16)}
    path = str(tmp_path / "w.safetensors")
    save_file(want, path)
    with torchdoctor.virtual_devices("cuda:0") as s:
        got = load_file(path, device="cuda")
        with safe_open(path, framework="pt", device="cuda") as f:
            one = f.get_tensor("w")
        assert {k: str(v.device) for k, v in got.items()} == {"w": "cuda:0", "b": "cuda:0"}
        assert one.device == torch.device("cuda:0")
        back = {k: v.cpu() for k, v in got.items()}
    assert not s.problems
    for k, v in want.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v)


def test_pinning_answers_as_on_a_gpu_machine() -> None:
    with torchdoctor.virtual_devices("cuda:0"):
        made = torch.empty(4, pin_memory=True)
        plain = torch.randn(4)
        pinned = plain.pin_memory()
        assert made.device.type == "cpu" and made.is_pinned()
        assert pinned.is_pinned() and not plain.is_pinned() and pinned is not plain  # pinning copies
        assert torch.equal(pinned, plain) and pinned.pin_memory() is pinned
        assert pinned.to("cuda", non_blocking=True).device == torch.device("cuda:0")
