"""``simulate(device="cpu", dtype=...)`` on a program that hard-codes ``device="cuda"`` (SAM's decoder
``torch.arange(..., device="cuda")``) on a machine without CUDA: a report naming the line and its factory, with
the fix at that call (``device=`` the input's, a diff), never torch's AssertionError out of simulate (hunt s15 V11)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Linear(4, 2)

    def forward(self, boxes: torch.Tensor) -> torch.Tensor:
        coords = torch.arange(8, device="cuda", dtype=torch.float32) / 8
        return self.mlp(boxes) + coords.mean()


def app(m: Decoder) -> torch.Tensor:
    return m(torch.rand(2, 4))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_a_hard_coded_cuda_is_a_report_on_the_cpu() -> None:
    r = torchdoctor.simulate(Decoder(), device="cpu", dtype=torch.float32, call=app)
    [p] = r.problems
    assert p.kind == "device" and p.message.startswith(
        "the program asks for cuda at tests/virtual/test_cpu_dtype_asks_cuda.py:")
    [fix] = r.fixes
    assert fix.code.startswith("# torch.arange made it on cuda: pass device= the input's device")
    assert fix.diff is not None and "+        coords = torch.arange(8, device=boxes.device, dtype=torch.float32) / 8" \
        in fix.diff


class TwoLines(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Linear(4, 2)

    def forward(self, boxes: torch.Tensor) -> torch.Tensor:
        coords_h = torch.arange(4, device="cuda", dtype=torch.float32) / 4
        coords_w = torch.arange(4, device="cuda", dtype=torch.float32) / 4
        return self.mlp(boxes - coords_h + coords_w)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_model_and_inputs_too_and_every_line_that_asks_is_fixed_in_one_patch() -> None:
    # a model and its inputs (the CLI's Target) as well as call=; the run stops at the first line that asks for
    # cuda, the re-run of its fix at the next: both lines join the fix, proven together, one patch
    r = torchdoctor.simulate(TwoLines(), (torch.rand(2, 4),), device="cpu", dtype=torch.float32)
    assert [p.kind for p in r.problems] == ["device"] and "asks for cuda" in r.problems[0].message
    assert len(r.fixes) == 2 and all(f.proven for f in r.fixes), r.text()
    patch = r.to_dict()["patch"]
    assert patch is not None and patch.count("\n@@ ") == 1, patch
    assert "+        coords_h = torch.arange(4, device=boxes.device, dtype=torch.float32) / 4" in patch
    assert "+        coords_w = torch.arange(4, device=boxes.device, dtype=torch.float32) / 4" in patch
