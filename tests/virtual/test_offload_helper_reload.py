"""A placement helper that moves the model and then offloads part of it: the fix never calls the helper again before
the use (it would offload the part again, hunt 29z: a DeepSeek-like model's experts); it moves the model at the use."""

from __future__ import annotations

import torch
import torch.nn as nn

import torchdoctor


def _place(model: nn.Module) -> None:
    model.to("cuda:1")
    model[1].to("cpu")  # the helper offloads the second block


def _app(model: nn.Module) -> torch.Tensor:
    _place(model)
    with torch.no_grad():
        return model(torch.randn(2, 8, device="cuda:1"))


def test_the_fix_does_not_call_the_offloading_helper_again() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    before = {n: (t.device, t.dtype) for n, t in model.state_dict().items()}
    report = torchdoctor.simulate(model, device="cuda:1", call=_app)
    assert {p.path for p in report.problems} >= {"1.weight"}
    codes = [f.code for f in report.fixes]
    assert codes and not any(c.lstrip().startswith("_place(model)") for c in codes), codes
    assert any("model.to('cuda:1')(" in c for c in codes), codes
    assert {n: (t.device, t.dtype) for n, t in model.state_dict().items()} == before  # simulate is read-only
