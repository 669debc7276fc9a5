"""A virtual GPU's default generators, seeds and NVTX ranges answer as a GPU build does (one generator per device,
seeds that stick, ranges that are no-ops without a profiler), where this CPU build has none; after the run the real
machine's answers are back."""

from __future__ import annotations

import threading

import pytest
import torch

import torchdoctor


def test_one_default_generator_per_device_and_seeds_that_stick() -> None:
    fresh = torch.Generator().initial_seed()  # torch's default seed, as every unseeded device generator has
    with torchdoctor.virtual_devices("cuda:1"):
        gens = torch.cuda.default_generators
        assert len(gens) == 2 and [str(g.device) for g in gens] == ["cuda:0", "cuda:1"]
        assert torch.cuda.initial_seed() == fresh
        torch.cuda.manual_seed(5)
        assert torch.cuda.initial_seed() == gens[0].initial_seed() == 5 and gens[1].initial_seed() == fresh
        torch.cuda.manual_seed_all(7)
        assert [g.initial_seed() for g in torch.cuda.default_generators] == [7, 7]
        with torch.cuda.device(1):
            torch.cuda.manual_seed(9)
            assert torch.cuda.initial_seed() == 9
        with torch.random.fork_rng(devices=[0, 1]):
            torch.randn(2, device="cuda")
        seen: list[int] = []
        worker = threading.Thread(target=lambda: seen.append(len(torch.cuda.default_generators)))
        worker.start()
        worker.join()
        assert seen == [2]  # a thread the run starts is part of it
    assert torch.cuda.default_generators == () and len(torch.cuda.default_generators) == 0


def test_xpu_has_its_generators_too() -> None:
    with torchdoctor.virtual_devices("xpu:0"):
        assert [str(g.device) for g in torch.xpu.default_generators] == ["xpu:0"]


def test_nvtx_ranges_are_no_ops_in_a_run() -> None:
    with pytest.raises(RuntimeError, match="NVTX functions not installed"):  # this build's own answer
        torch.cuda.nvtx.range_push("step")
    with torchdoctor.virtual_devices("cuda:0"):
        assert isinstance(torch.cuda.nvtx.range_push("step"), int)
        torch.cuda.nvtx.mark("here")
        with torch.cuda.nvtx.range("fwd"):
            torch.ones(2, device="cuda")
        assert isinstance(torch.cuda.nvtx.range_pop(), int)
    with pytest.raises(RuntimeError, match="NVTX functions not installed"):
        torch.cuda.nvtx.range_push("step")
