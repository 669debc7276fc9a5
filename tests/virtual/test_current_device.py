"""``virtual_devices("cuda:N")`` / ``run --device cuda:N`` put the program's own device choice on cuda:N, as
``CUDA_VISIBLE_DEVICES`` plus ``torch.cuda.set_device(N)`` would (issue 40, point 3), and say where the work ran."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor


@pytest.mark.parametrize("device", ["cuda:1", "cuda:3", "xpu:1"])
def test_the_programs_own_choice_lands_on_the_device_asked_for(device: str) -> None:
    kind, index = device.split(":")
    api = getattr(torch, kind)
    with torchdoctor.virtual_devices(device) as sim:
        assert api.current_device() == int(index) and api.device_count() == int(index) + 1
        # an app that picks its device as ComfyUI does
        picked = torch.device(kind, api.current_device())
        model = nn.Linear(4, 4).to(picked)
        y = model(torch.ones(2, 4, device=kind))  # a bare "cuda" is the current device
        z = torch.ones(2, 4).to(kind) + torch.zeros(2, 4).cuda() if kind == "cuda" else y
    assert sim.ok, sim.problems
    assert y.device == torch.device(device) and z.device == torch.device(device)
    assert sim.ran_on == (device,) and sim.where_ran() == f"ran on {device}"


def test_an_app_that_picks_another_device_is_said_so() -> None:
    with pytest.raises(torchdoctor.PlacementError) as info:
        with torchdoctor.virtual_devices("cuda:1") as sim:
            model = nn.Linear(4, 4).to("cuda:0")  # the app's own fixed choice
            model(torch.ones(2, 4, device="cuda:0")) * torch.ones(4, device="cuda")
    assert sim.ran_on == ("cuda:0", "cuda:1")
    assert sim.where_ran() == "ran on cuda:0, cuda:1 (the program picked them; cuda:1 was asked for)"
    assert "the work ran on cuda:0, cuda:1 (the program picked them; cuda:1 was asked for)" in str(info.value)


def test_only_cuda0_work_is_said_to_have_run_there() -> None:
    with torchdoctor.virtual_devices("cuda:1") as sim:
        nn.Linear(4, 4).to("cuda:0")(torch.ones(2, 4, device="cuda:0"))
    assert sim.ok and sim.where_ran() == "ran on cuda:0 (the program picked it; cuda:1 was asked for)"


def test_select_off_keeps_device_zero_current() -> None:
    """What the pytest marker does: a bare "cuda" meeting cuda:1 weights is the bug it looks for."""
    with torchdoctor.virtual_devices("cuda:1", select=False, raise_on_exit=False) as sim:
        assert torch.cuda.current_device() == 0
        nn.Linear(4, 2).to("cuda:1")(torch.ones(3, 4).cuda())
    [p] = sim.problems
    assert p.kind == "device" and p.found == "cuda:0" and p.expected == "cuda:1"
