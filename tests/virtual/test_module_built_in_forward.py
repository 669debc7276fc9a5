"""A module built inside a forward (``nn.BatchNorm2d(8)(x)``, geekTime-semantic-segmentation#1): its parameters and
buffers are made on the CPU by that constructor's line. The maker is the constructor at the user's line, not the
``torch.empty`` inside torch, and the fix passes it ``device=``, proven at the failing op."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        return nn.BatchNorm2d(num_features=8)(x)  # built on every call, on the cpu


class Built(nn.Module):  # the correct variant: built in __init__, moved by Module.to
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


def test_the_constructor_at_the_users_line_is_the_maker_and_its_fix_is_proven() -> None:
    report = torchdoctor.simulate(Block(), (torch.randn(1, 4, 8, 8),), "xpu")
    assert not report.ok
    (problem,) = report.problems
    assert "made by torch.nn.BatchNorm2d" in problem.message and "test_module_built_in_forward.py:20" in problem.message
    assert "torch.empty" not in problem.message
    assert report.fix is not None and "torch.nn.BatchNorm2d(..., device=x.device)" in report.fix



def test_in_a_block_the_constructors_fix_is_proven_at_the_failing_op() -> None:
    with torchdoctor.virtual_devices("xpu", raise_on_exit=False) as session:
        model = Block().to("xpu")
        model(torch.randn(1, 4, 8, 8, device="xpu"))
    (fix,) = session.fixes
    assert "torch.nn.BatchNorm2d(..., device=x.device)" in fix.code
    assert fix.proven and fix.tried.startswith("at the failing op aten.native_batch_norm")


def test_a_module_built_in_init_is_quiet() -> None:
    assert torchdoctor.simulate(Built(), (torch.randn(1, 4, 8, 8),), "xpu").ok
