"""``simulate(device="cpu", dtype=...)`` on models that hold a tensor computed with autograd (``weight_norm``'s
``weight``, remade from ``weight_g`` and ``weight_v`` before every call: audio VAEs and vocoders use it): the copy
is made without deepcopy's "graph leaves" refusal, the report comes back, the user's model is untouched, and a
factory fixed at the program's line is proven by a re-run with that line changed (hunt U31, U30)."""

from __future__ import annotations

import warnings

import torch
from torch import nn

import torchdoctor


def _vocoder() -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return nn.Sequential(nn.utils.weight_norm(nn.Conv1d(2, 4, 3)), nn.Conv1d(4, 4, 1))


def test_a_weight_norm_model_is_checked_in_a_dtype_on_the_cpu_and_left_as_it_was() -> None:
    model = _vocoder()
    weight, v = model[0].weight, model[0].weight_v
    report = torchdoctor.simulate(model, (torch.randn(1, 2, 8),), device="cpu", dtype=torch.float16)
    assert report.ok, report.text()
    assert report.ops > 0
    assert model[0].weight is weight and model[0].weight_v is v and v.dtype == torch.float32


def test_the_programs_fp32_input_is_found_and_its_factory_fix_proven_by_a_re_run() -> None:
    def app(model: nn.Module) -> torch.Tensor:
        model.to(torch.float16)
        return model(torch.randn(1, 2, 8))  # the program's input left in float32

    report = torchdoctor.simulate(_vocoder(), device="cpu", dtype=torch.float16, call=app)
    assert [(p.kind, p.found, p.expected) for p in report.problems] == [("dtype", "float32", "float16")]
    assert "a tensor made by torch.randn" in report.problems[0].message
    fix = report.fixes[0]
    assert fix.proven, report.text()
    assert "torch.randn(..., dtype=torch.float16)" in fix.code
    assert "+        return model(torch.randn(1, 2, 8, dtype=torch.float16))" in (fix.diff or "")
