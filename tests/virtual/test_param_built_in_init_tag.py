"""A Parameter a module builds in its ``__init__`` and a placement of the model's layers leaves on the cpu (an app
that moves each layer itself, skipping the Parameters no layer owns) is tagged as built in ``__init__`` by its line,
never as a lazy layer's "built in forward after the model's .to" (whose fix — build it in ``__init__`` — it already
is); a Parameter a forward really builds keeps that tag."""

from __future__ import annotations

import torch
import torch.nn as nn

import torchdoctor
from torchdoctor._virtual.tensor import current_space


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


class _Lazy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if "w" not in self._parameters:
            self.w = nn.Parameter(torch.ones(4))
        return x * self.w


def _tag(model: nn.Module, name: str) -> str:
    space = current_space()
    kept = space.real_record(getattr(model, name)) if space is not None else None
    return kept[1].op if kept is not None and kept[1] is not None else ""


def test_a_parameter_built_in_init_is_tagged_by_its_line() -> None:
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False):
        net = _Net()
        for child in net.children():
            child.to("cuda")
        net(torch.randn(2, 4, device="cuda"))
        tag = _tag(net, "scale")
    assert tag.startswith("torch.nn.Parameter `scale` built in __init__ at ") and "not moved with its module" in tag, tag
    assert "built in forward" not in tag


def test_a_parameter_built_in_forward_keeps_the_lazy_tag() -> None:
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False):
        lazy = _Lazy().to("cuda")
        lazy(torch.randn(4, device="cuda"))
        tag = _tag(lazy, "w")
    assert tag == "torch.nn.Parameter `w` built in forward after the model's .to", tag
