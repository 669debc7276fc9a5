"""A dtype check on the CPU (``simulate(..., device="cpu", dtype=torch.float16)``) names the maker of an off-dtype
operand as a virtual run does: the cast (``x.float()``, ``.to(torch.float32)``, ``.to(self.cdt)`` read from a class
attribute), its line and the module it ran in, and fixes it there, proven by a re-run with that line or attribute
changed; never "pass the tensors made in float32"."""

from __future__ import annotations

import inspect

import torch
from torch import nn

import torchdoctor


def _at(cls: type, text: str) -> str:
    lines, start = inspect.getsourcelines(cls)
    return f"tests/virtual/test_maker_cpu_casts.py:{start + next(i for i, ln in enumerate(lines) if text in ln)}"


class Floated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.float())


class ToFloat32(nn.Module):  # a 3-d input: F.linear views it before the matmul
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        return self.lin(h)


class ClassDtype(nn.Module):
    compute_dtype = torch.float32

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.to(self.compute_dtype))


def _check(model: nn.Module, x: torch.Tensor) -> torchdoctor.SimulationReport:
    report = torchdoctor.simulate(model, (x,), device="cpu", dtype=torch.float16)
    assert len(report.problems) == 1, report.text()
    return report


def test_a_method_cast_is_named_and_fixed_at_its_line() -> None:
    report = _check(Floated(), torch.randn(2, 4))
    at = _at(Floated, "x.float()")
    assert report.problems[0].message.startswith(f"a tensor made by `float()` at {at} in `<root>` float32[2, 4] "
                                                 "meets float16 in aten.addmm.default")
    assert "pass the tensors made" not in (report.fix or "")
    (fix,) = report.fixes
    assert fix.proven and fix.kind == "line", report.text()
    assert fix.code.startswith(f"# {at}: `return self.lin(x.float())` casts to float32 where aten.addmm.default "
                               "computes in float16: cast to float16 there")
    assert fix.diff is not None and "+        return self.lin(x.to(self.lin.weight.dtype))" in fix.diff  # the layer's own


def test_a_cast_seen_through_a_view_keeps_its_maker() -> None:
    report = _check(ToFloat32(), torch.randn(2, 3, 4))
    assert report.problems[0].message.startswith(
        f"a tensor made by `to(torch.float32)` at {_at(ToFloat32, 'x.to(torch.float32)')} in `<root>` float32[")
    assert [f.proven for f in report.fixes] == [True], report.text()


def test_a_class_attribute_dtype_is_fixed_on_the_attribute() -> None:
    report = _check(ClassDtype(), torch.randn(2, 4))
    at = _at(ClassDtype, "x.to(self.compute_dtype)")
    assert f"a tensor made by `to(self.compute_dtype)` at {at} (dtype read from the class attribute " \
           "ClassDtype.compute_dtype) in `<root>`" in report.problems[0].message
    assert report.fix == (f"model.compute_dtype = torch.float16  # the class attribute ClassDtype.compute_dtype is "
                          f"float32; `to(self.compute_dtype)` at {at} casts to it, aten.addmm.default computes in "
                          "float16")
    assert [f.proven for f in report.fixes] == [True]
    assert ClassDtype.compute_dtype is torch.float32  # the proof worked on a copy: the user's class is untouched
