"""``simulate`` of objects that cannot be deep-copied (issue 40, point 4): ComfyUI's model configs answer None for
any attribute, so ``copy.deepcopy`` of a ModelPatcher / BaseModel calls None. The object is run in place in a
virtual session and put back: its tensors, parameters and attributes are the user's again, unchanged."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor


class _Config:
    """Answers None for any attribute it lacks, as ComfyUI's model configs do."""

    def __init__(self) -> None:
        self.unet_config = {"in_channels": 4}

    def __getattr__(self, name: str) -> Any:
        return None


class _BaseModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model_config = _Config()
        self.diffusion_model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
        self.sigmas = torch.linspace(0, 1, 8)  # a plain attribute: Module.to leaves it on the cpu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.diffusion_model(x)


class _Patcher:
    """Holds the model and where it loads, as ComfyUI's ModelPatcher does."""

    def __init__(self, model: _BaseModel) -> None:
        self.model, self.load_device = model, torch.device("cuda", 0)


def _state(m: nn.Module) -> list[tuple[str, Any, torch.device, torch.dtype]]:
    return [(k, id(v), v.device, v.dtype) for k, v in [*m.named_parameters(), *m.named_buffers(),
                                                        ("sigmas", m.sigmas)]]


def test_the_mechanism_breaks_deepcopy() -> None:
    with pytest.raises(TypeError, match="NoneType"):
        copy.deepcopy(_BaseModel())


def test_an_uncopyable_model_is_simulated_in_place_and_put_back() -> None:
    model = _BaseModel()
    before, weight = _state(model), model.diffusion_model[0].weight.detach().clone()
    report = torchdoctor.simulate(model, (torch.randn(2, 8),), device="cuda:1", dtype="bfloat16")
    assert report.ok, report.text()
    assert report.forward and report.device == torch.device("cuda:1")
    assert _state(model) == before and torch.equal(model.diffusion_model[0].weight, weight)
    assert type(model.diffusion_model[0].weight) is nn.Parameter


def test_a_patcher_runs_with_call_and_a_planted_bug_is_named_by_path() -> None:
    patcher = _Patcher(_BaseModel())
    before = _state(patcher.model)

    def sample(p: _Patcher) -> None:  # the node's code: the model loads, then the sampler reads the schedule
        p.model.to(p.load_device)
        x = p.model(torch.randn(2, 8, device=p.load_device))
        x * p.model.sigmas  # the planted bug: the schedule stayed on the cpu

    report = torchdoctor.simulate(patcher, device="cuda:0", call=sample)
    assert [(p.kind, p.found) for p in report.problems] == [("device", "cpu")], report.text()
    assert "sigmas" in report.problems[0].message or report.problems[0].path == "model.sigmas", report.text()
    assert _state(patcher.model) == before and patcher.model.sigmas.device.type == "cpu"


_KEYS = ("active_bytes.all.current", "reserved_bytes.all.current", "allocated_bytes.all.current",
         "allocated_bytes.all.peak", "active_bytes.large_pool.current", "num_alloc_retries", "num_ooms")


@pytest.mark.parametrize("kind", ["cuda", "xpu", "mps"])
def test_every_memory_query_answers_with_the_real_keys(kind: str) -> None:
    """What ComfyUI reads at import and on every model load, on each device kind (xpu through ``torch.xpu``; mps
    has no ``memory_stats`` of its own: ``torch.accelerator`` and ``torch.mps``'s functions)."""
    with torchdoctor.virtual_devices(kind) as sim:
        x = torch.ones(1024, 1024, device=kind)  # 4 MiB
        stats = [torch.accelerator.memory_stats(), torch.accelerator.memory_stats(0)]
        if kind != "mps":
            api = getattr(torch, kind)
            dev = torch.device(kind, api.current_device())
            stats += [api.memory_stats(dev), api.memory_stats(), api.memory.memory_stats(dev)]
            assert api.memory_allocated(dev) == api.memory_reserved(dev) == 4 << 20
            free, total = api.mem_get_info(dev)
            assert total - free == 4 << 20
        else:
            assert torch.mps.current_allocated_memory() == torch.mps.driver_allocated_memory() == 4 << 20
            assert torch.mps.recommended_max_memory() > 0
        del x
    assert sim.ok
    for s in stats:
        assert all(k in s for k in _KEYS), sorted(s)[:5]
        assert s["active_bytes.all.current"] == s["reserved_bytes.all.current"] == 4 << 20
