"""``simulate(model, "cuda:1", torch.bfloat16)``: the device and dtype written where the inputs go are read as such.

A string or ``torch.device`` is never a model's inputs; a user who writes the device second (as ``Module.to`` takes
it) gets the simulation asked for, not ``not a device: torch.bfloat16`` or a run on the characters of ``"cuda:1"``.
"""

from __future__ import annotations

import pytest
import torch

import torchdoctor


@pytest.mark.parametrize("args", [("cuda:1", torch.bfloat16), ("cuda:1", "bfloat16"), (torch.device("cuda:1"),),
                                  ("cuda:1", None, torch.bfloat16)])
def test_the_device_and_dtype_written_second_and_third_are_simulated(args: tuple) -> None:
    model = torch.nn.Linear(4, 2)
    model.extra = torch.nn.Linear(2, 2)  # moved with the model: a clean run
    report = torchdoctor.simulate(model, *args)
    assert report.device == torch.device("cuda:1")
    assert report.dtype == (None if len(args) == 1 else torch.bfloat16)
    assert report.ok
    assert model.weight.device.type == "cpu" and model.weight.dtype == torch.float32  # the user's model untouched


def test_inputs_then_device_still_mean_what_they_did() -> None:
    model = torch.nn.Linear(4, 2)
    report = torchdoctor.simulate(model, (torch.randn(3, 4),), "cuda:1", "bfloat16")
    assert report.ok and report.device == torch.device("cuda:1") and report.dtype == torch.bfloat16


def test_no_device_at_all_says_what_to_write() -> None:
    with pytest.raises(TypeError, match=r"simulate needs device=, the device to simulate"):
        torchdoctor.simulate(torch.nn.Linear(4, 2))
