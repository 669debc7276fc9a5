"""Device 0 is current in ``virtual_devices("cuda:N")`` and ``run --device cuda:N``, as on real hardware: a bare
``"cuda"`` (``.cuda()``, ``torch.device("cuda")``, ``device="cuda"``) is ``cuda:0`` unless the program calls
``torch.cuda.set_device`` (bytedance/Bernini#61: ``timestep.cuda()`` lands on cuda:0 on a two-GPU box), so every
verb finds what simulate finds (hunt T14); ``select=True`` makes the device current, as ``CUDA_VISIBLE_DEVICES``
plus ``set_device(N)`` would. Where the work ran is said."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import torchdoctor


class _Sched:  # Bernini's mechanism in a few lines: the scheduler's timesteps on the run's device
    def __init__(self, device: str) -> None:
        self.timesteps = torch.linspace(1000, 0, 5, device=device)

    def step(self, t: torch.Tensor) -> torch.Tensor:
        return (self.timesteps - t.cuda()).abs().argmin()  # the bug: .cuda() is the current device


@pytest.mark.parametrize("device", ["cuda:1", "cuda:3", "xpu:1"])
def test_device_zero_is_current_as_on_real_hardware(device: str) -> None:
    kind, index = device.split(":")
    api = getattr(torch, kind)
    with torchdoctor.virtual_devices(device) as sim:
        assert api.current_device() == 0 and api.device_count() == int(index) + 1
        y = nn.Linear(4, 4).to(kind)(torch.ones(2, 4, device=kind))  # the program's own "cuda": all on device 0
    assert sim.ok and y.device == torch.device(kind, 0)
    assert sim.where_ran() == f"ran on {kind}:0 (the program picked it; {device} was asked for)"


def test_a_hard_coded_cuda_call_meets_the_run_device() -> None:
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        sched = _Sched("cuda:1")
        sched.step(torch.tensor(250.0, device="cuda:1"))
    [p] = sim.problems
    assert (p.kind, p.found, p.expected, p.op) == ("device", "cuda:0", "cuda:1", "aten.sub.Tensor")


@pytest.mark.parametrize("how", ["set_device", "device_context"])
def test_a_program_that_sets_its_device_is_quiet(how: str) -> None:
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        if how == "set_device":
            torch.cuda.set_device(1)
            sched = _Sched("cuda:1")
            sched.step(torch.tensor(250.0, device="cuda:1"))
        else:
            with torch.cuda.device(1):
                assert torch.cuda.current_device() == 1
                _Sched("cuda:1").step(torch.tensor(250.0, device="cuda:1"))
            assert torch.cuda.current_device() == 0
    assert sim.ok and not sim.problems and sim.ran_on == ("cuda:1",)


@pytest.mark.parametrize("device", ["cuda:1", "xpu:1"])
def test_select_makes_the_device_current(device: str) -> None:
    kind, index = device.split(":")
    api = getattr(torch, kind)
    with torchdoctor.virtual_devices(device, select=True) as sim:
        assert api.current_device() == int(index)
        picked = torch.device(kind, api.current_device())  # an app that picks its device as ComfyUI does
        y = nn.Linear(4, 4).to(picked)(torch.ones(2, 4, device=kind))
    assert sim.ok, sim.problems
    assert y.device == torch.device(device) and sim.ran_on == (device,) and sim.where_ran() == f"ran on {device}"


def test_an_app_that_picks_two_devices_is_said_so() -> None:
    with pytest.raises(torchdoctor.PlacementError) as info:
        with torchdoctor.virtual_devices("cuda:1") as sim:
            model = nn.Linear(4, 4).to("cuda:0")  # the app's own fixed choice
            model(torch.ones(2, 4, device="cuda:0")) * torch.ones(4, device="cuda:1")
    assert sim.ran_on == ("cuda:0", "cuda:1")
    assert sim.where_ran() == "ran on cuda:0, cuda:1 (the program picked them; cuda:1 was asked for)"
    assert "the work ran on cuda:0, cuda:1 (the program picked them; cuda:1 was asked for)" in str(info.value)


def test_run_finds_the_hard_coded_cuda_call(tmp_path: Path) -> None:
    """The run verb: the same program, a file run with ``--device cuda:1``."""
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent("""
        import torch
        timesteps = torch.linspace(1000, 0, 5, device="cuda:1")
        t = timesteps[1].cpu()
        print(int((timesteps - t.cuda()).abs().argmin()))
    """), encoding="utf-8")
    env = dict(os.environ, HF_HUB_OFFLINE="1", NO_COLOR="1")
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda:1", str(script)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "1 problem(s) recorded" in proc.stderr and "is on cuda:0 while aten.sub.Tensor runs on cuda:1" in proc.stderr
