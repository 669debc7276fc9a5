"""A lazy module built on a virtual device (``nn.LazyLinear(2, device="cuda")``) materializes its parameters there on
its first call, as on the GPU: torch assigns ``__class__`` to the class the parameter becomes, so the virtual
uninitialized parameter becomes a virtual Parameter of the same layout."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


def test_a_lazy_linear_built_on_the_device_materializes_there() -> None:
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        m = nn.LazyLinear(2, device="cuda")
        assert isinstance(m.weight, nn.UninitializedParameter)
        y = m(torch.randn(3, 5, device="cuda"))
        assert isinstance(m.weight, nn.Parameter) and not isinstance(m.weight, nn.UninitializedParameter)
        assert m.weight.shape == (2, 5) and m.weight.device == torch.device("cuda:0")
        assert y.shape == (3, 2) and y.device == torch.device("cuda:0")
        y.sum().backward()
        assert m.weight.grad is not None and m.weight.grad.shape == (2, 5)
    assert sim.ok and not sim.problems, sim.problems
