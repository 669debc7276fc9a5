"""An EMA that lerps every state-dict tensor, BatchNorm's int64 ``num_batches_tracked`` too (MultimediaTechLab/YOLO
PR #235): the kernel refuses the integer tensor on every device, the CPU included. A ``virtual_devices`` block
records it as the program's own error at its line, the operand named by its state-dict key, with the fix at that
line (lerp floating tensors only); never "a check torch makes before any op", never a move of the model."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import torchdoctor


def _ema_steps(dev: str, batched: bool) -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(64, 2)).to(dev)
    model(torch.randn(2, 3, 6, 6, device=dev))
    ema = copy.deepcopy(model).requires_grad_(False)
    with torch.no_grad():
        msd = model.state_dict()
        if batched:
            pairs = [(v, msd[k]) for k, v in ema.state_dict().items()]
            torch._foreach_lerp_([e for e, _ in pairs], [m for _, m in pairs], 0.1)
        else:
            for k, v in ema.state_dict().items():
                v.lerp_(msd[k], 0.1)


@pytest.mark.parametrize(("dev", "batched"), [("cuda", True), ("xpu", False)])
def test_integer_operand_is_the_programs_error(dev: str, batched: bool) -> None:
    with pytest.raises(torchdoctor.PlacementError) as err:
        with torchdoctor.virtual_devices(dev):
            _ema_steps(dev, batched)
    text = str(err.value)
    assert "reads 1.num_batches_tracked (int64): NotImplementedError: " in text
    assert "not implemented for 'Long'" in text and "takes no integer tensors on any device" in text
    assert "the run ended at the program's own error at " in text and "test_rt_s18_int_operand_refused.py:2" in text
    assert "a check torch makes before any op" not in text and "torchdoctor.move(" not in text
    assert "give the op floating tensors only and copy the others" in text
    assert isinstance(err.value.__cause__, NotImplementedError)  # the error the device raises, chained


def test_floating_tensors_only_is_quiet() -> None:
    with torchdoctor.virtual_devices("cuda") as s:
        model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)).to("cuda")
        ema = copy.deepcopy(model)
        msd = model.state_dict()
        with torch.no_grad():
            for k, v in ema.state_dict().items():
                v.lerp_(msd[k], 0.1) if v.dtype.is_floating_point else v.copy_(msd[k])
    assert s.problems == []
