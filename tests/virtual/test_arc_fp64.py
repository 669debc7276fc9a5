"""An Intel Arc card has no float64 kernels ("Required aspect fp64 is not supported on the device"): a virtual xpu
with the arc profile names the filling factory that makes float64 on the device, and every op that computes in it,
with the factory's dtype fix proven and its patch; the float64 kept as data only (a move, a view) is not a problem,
and the default xpu profile (a data-centre card with fp64) is quiet."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor
from torchdoctor._rules.presets import preset
from torchdoctor._rules.registry import check_all


class Rope(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = torch.arange(0, 8, dtype=torch.float64, device=x.device)  # the maker
        g = torch.outer(f * 2.0, f)
        return self.q(x) + g.sum().to(x.dtype)


def test_arc_names_the_float64_factory_and_proves_its_dtype_fix() -> None:
    report = torchdoctor.simulate(Rope(), (torch.randn(2, 8),), device="xpu", profile="arc")
    assert not report.ok and {p.kind for p in report.problems} == {"unsupported_dtype"}
    first = report.problems[0]
    assert "torch.arange(dtype=float64, device='xpu:0') at " in first.message
    assert "has no float64 kernels" in first.message and "Required aspect fp64 is not supported" in first.message
    assert any("cannot compute in float64" in p.message for p in report.problems[1:])
    text = str(report)
    assert "pass dtype=torch.float32 to torch.arange" in text and "xpu has no float64 kernels" in text
    assert "fix proven" in text and "dtype=torch.float32, device=x.device" in text  # the patch
    assert "torchdoctor.move(model" not in text


def test_float64_held_as_data_is_no_problem_and_fp64_cards_are_quiet() -> None:
    arc = preset("arc")
    t = torch.ones(4, dtype=torch.float64, device="meta")
    assert check_all(torch.ops.aten.mul.Tensor, (t, t), {}, profile=arc) == []  # meta: not on the xpu
    assert torchdoctor.simulate(Rope(), (torch.randn(2, 8),), device="xpu").ok  # default xpu profile has fp64
    with torchdoctor.virtual_devices("xpu", profile="arc"):
        kept = torch.ones(4, dtype=torch.float64).to("xpu")  # moved and viewed, never computed with
        assert kept.view(2, 2).dtype == torch.float64
