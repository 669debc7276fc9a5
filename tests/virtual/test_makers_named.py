"""The maker of an off-policy tensor is named in a virtual run (issue 41 point 2): the factory or cast op, its line,
where a cast read its dtype (an attribute, a class attribute, a config), a Parameter a forward built lazily."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

import torchdoctor


def _at(cls: type, text: str) -> str:
    lines, start = inspect.getsourcelines(cls)
    return f"tests/virtual/test_makers_named.py:{start + next(i for i, ln in enumerate(lines) if text in ln)}"


def _one(model: nn.Module, x: torch.Tensor, **kw: object) -> str:
    report = torchdoctor.simulate(model, (x,), device="cuda:0", **kw)  # type: ignore[arg-type]
    assert len(report.problems) == 1, report.text()
    return report.problems[0].message


class InstanceDtype(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.compute_dtype = torch.bfloat16  # set per instance

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.to(self.compute_dtype))


class ConfigDtype(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.config = SimpleNamespace(torch_dtype=torch.float16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.to(self.config.torch_dtype))


def test_a_cast_names_the_attribute_or_config_its_dtype_was_read_from() -> None:
    msg = _one(InstanceDtype(), torch.randn(2, 4))
    assert f"a tensor made by `to(self.compute_dtype)` at {_at(InstanceDtype, 'x.to(self.compute_dtype)')} (dtype " \
           "read from the attribute self.compute_dtype of InstanceDtype) in `<root>` from input 0" in msg
    msg = _one(ConfigDtype(), torch.randn(2, 4))
    assert "(dtype read from the config self.config.torch_dtype) in `<root>` from input 0" in msg
    report = torchdoctor.simulate(InstanceDtype(), (torch.randn(2, 4),), device="cuda:0")
    assert report.fix == "model.compute_dtype = torch.float32  # the attribute self.compute_dtype of InstanceDtype " \
                         "is bfloat16; `to(self.compute_dtype)` at " + _at(InstanceDtype, "x.to(self.compute_dtype)") \
                         + " casts to it, aten.addmm.default computes in float32"
    assert [f.proven for f in report.fixes] == [True]


class Factories(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(4)
        return x + mask


class FromHost(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.as_tensor(np.ones(4, np.float32))


class Lazy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w: nn.Parameter | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w is None:
            self.w = nn.Parameter(torch.randn(4))
        return x + self.w


def _made(model: nn.Module) -> torchdoctor.SimulationReport:
    return torchdoctor.simulate(model, device="cuda:0",
                                call=lambda m: m.to("cuda:0")(torch.ones(4, 4, device="cuda:0")))


def test_factories_in_forward_are_named_with_their_line() -> None:
    report = _made(Factories())
    assert f"a tensor made by torch.zeros in `<root>` at {_at(Factories, 'torch.zeros(4)')} f32[4]@cpu is on cpu" \
           in report.problems[0].message
    report = _made(FromHost())
    assert f"a tensor made by torch.as_tensor in `<root>` at {_at(FromHost, 'torch.as_tensor')} f32[4]@cpu" \
           in report.problems[0].message


def test_a_parameter_built_lazily_in_forward_is_named_with_its_attribute() -> None:
    report = _made(Lazy())
    assert report.problems[0].message.startswith("a tensor made by torch.nn.Parameter `w` built in forward after the "
                                                 "model's .to in `<root>` f32[4]@cpu is on cpu")
    assert report.fix is not None and "build it in __init__, or run one forward before the model's .to" in report.fix
