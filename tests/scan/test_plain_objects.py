"""A scanned object that is not a module but moves its own tensors (diffusers' EMAModel keeps ``shadow_params`` in
a list and has its own ``to(device=)``): its tensors' problem names that method, never "Module.to never moves it"
as if the fix were a module's."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


def test_ema_model_tensors_point_to_its_own_to() -> None:
    from diffusers.training_utils import EMAModel

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    ema = EMAModel(model.parameters())
    report = torchdoctor.scan(ema, "cuda:0")
    assert {p.path for p in report.problems} == {f"shadow_params.{i}" for i in range(4)}
    msg = report.problems[0].message
    assert "held by EMAModel, not by a module" in msg
    assert "EMAModel has its own to(): call it with device='cuda:0' (unproven: scan never runs it)" in msg
    assert "Module.to never moves it" not in msg
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        ema.to(device="cuda:0")  # the move named, applied
        assert torchdoctor.scan(ema, "cuda:0").ok
    assert sim.problems == []


def test_a_plain_holder_without_its_own_to_keeps_the_module_text() -> None:
    class Holder:
        def __init__(self) -> None:
            self.table = torch.ones(3)

    report = torchdoctor.scan({"h": Holder(), "m": nn.Linear(2, 2)}, "cuda:0", strict=True)
    texts = [p.message for p in report.problems if p.path.endswith("table")]
    assert texts and all("has its own to()" not in t for t in texts)
