"""diffusers hooks that replace ``module.forward`` on the instance (``enable_layerwise_casting``,
``apply_group_offloading``): correct setups are quiet in scan, simulate and guard, the user's model is never touched
by a simulation, and a real leftover is still named by its path."""

from __future__ import annotations

import warnings

import pytest
import torch
from diffusers.hooks import apply_group_offloading
from torch import nn

import torchdoctor
from support import zoo

BF = torch.bfloat16
F8 = torch.float8_e4m3fn


def _layerwise_unet() -> zoo.Built:
    b = zoo.build("unet", BF)
    b.obj.enable_layerwise_casting(storage_dtype=F8, compute_dtype=BF)
    return b


def _state(m: nn.Module) -> dict[str, tuple[int, torch.dtype, str]]:
    return {n: (p.data_ptr(), p.dtype, str(p.device)) for n, p in m.named_parameters()}


def test_layerwise_casting_is_quiet_and_simulate_leaves_the_model_alone() -> None:
    b = _layerwise_unet()
    before = _state(b.obj)
    assert torchdoctor.scan(b.obj).ok
    report = torchdoctor.simulate(b.obj, b.inputs, device="cuda:1")
    assert report.ok, report.problems[:3]
    assert _state(b.obj) == before  # the copy's hooks cast the copy, not the user's weights
    for mode in ("strict", "fix", "explain"):
        with torchdoctor.guard(b.obj, mode=mode):
            b.run()


@pytest.mark.parametrize("level", ["block_level", "leaf_level"])
def test_group_offloading_is_offload_by_design(level: str) -> None:
    b = zoo.build("unet", BF)
    kw = {"num_blocks_per_group": 1} if level == "block_level" else {}
    apply_group_offloading(b.obj, onload_device=torch.device("cuda:1"), offload_device=torch.device("cpu"),
                           offload_type=level, **kw)
    report = torchdoctor.scan(b.obj, device="cuda:1")
    assert report.ok, report.problems[:3]
    if level == "block_level":  # a hook on the root (the modules outside the blocks): the component is offloaded
        assert report.expected[""]["offloaded"] == "moved to cuda:1 at call by diffusers group offloading"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = torchdoctor.simulate(b.obj, b.inputs, device="cuda:1")
    assert sim.ok, sim.problems[:3]
    # asked where cuda:1 exists (virtually): the refusal is the offloading's, whatever this machine has
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False), \
            pytest.raises(torchdoctor.PlacementError, match="GroupOffloadingHook .diffusers group offloading.") as e:
        torchdoctor.move(b.obj, device="cuda:1")
    assert "apply_group_offloading(model, onload_device=" in str(e.value)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.pe = torch.zeros(8)  # a plain attribute: group offloading onloads parameters and buffers only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.pe


def test_group_offloading_with_a_planted_leftover_names_it() -> None:
    m = nn.Sequential(_Block(), _Block())
    apply_group_offloading(m, onload_device=torch.device("cuda:1"), offload_device=torch.device("cpu"),
                           offload_type="leaf_level")
    report = torchdoctor.simulate(m, (torch.ones(2, 8),), device="cuda:1")
    assert not report.ok
    assert [p.path for p in report.problems][:1] == ["0.pe"], report.problems
    assert len(report.problems) <= 2
