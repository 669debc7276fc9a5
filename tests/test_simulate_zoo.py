"""Every zoo model runs clean on virtual cuda:1, xpu:0 and mps, in float32 and bfloat16 (LoRA variants included),
and the user's object is bit-for-bit unchanged afterwards."""

from __future__ import annotations

import pytest
import torch
import zoo
from helpers import assert_unchanged

import torchdoctor


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("device", ["cuda:1", "xpu:0", "mps"])
@pytest.mark.parametrize("name", zoo.NAMES)
def test_zoo_model_runs_clean(name: str, device: str, dtype: torch.dtype) -> None:
    built = zoo.build(name, dtype)
    target = built.target()
    report = assert_unchanged(built.obj, torchdoctor.simulate, target, device=device, dtype=dtype)
    assert report.ok, "\n".join(str(p) for p in report.problems)
    assert report.ops > 0 and report.stopped is None
