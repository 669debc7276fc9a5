"""A kernel that refuses an integer dtype (an EMA's ``_foreach_lerp_`` over a state dict that holds BatchNorm's int64
``num_batches_tracked``, MultimediaTechLab/YOLO PR #235) is the program's own error on every device: a virtual run
raises it as the device does, never "cannot be simulated"; floating tensors alone lerp quietly."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


def _ema(floats_only: bool) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).to("cuda")
    ema = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).to("cuda")
    pairs = [(e, m) for e, m in zip(ema.state_dict().values(), model.state_dict().values())
             if m.dtype.is_floating_point or not floats_only]
    with torch.no_grad():
        torch._foreach_lerp_([e for e, _ in pairs], [m for _, m in pairs], 0.1)


def test_a_lerp_of_an_int64_buffer_raises_as_on_the_device() -> None:
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        _ema(floats_only=False)
    assert isinstance(sim.failure, NotImplementedError) and "not implemented for 'Long'" in str(sim.failure)
    assert not any(p.kind == "unsupported_op" or "cannot be simulated" in p.message for p in sim.problems), sim.problems


def test_floating_tensors_alone_lerp_quietly() -> None:
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        _ema(floats_only=True)
    assert sim.ok, sim.problems
