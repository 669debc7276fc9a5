"""The program's own CPU input handed to a module in a virtual run stays in the program's autograd graph, as on the
CPU: its ``.grad`` after ``backward()`` is the CPU run's, and a layer with no weight in the path still records."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


def _cpu_grad(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    x = x.detach().clone().requires_grad_(True)
    layer(x).sum().backward()
    assert x.grad is not None
    return x.grad


def test_input_grad_as_on_the_cpu() -> None:
    torch.manual_seed(0)
    lin, x0 = nn.Linear(4, 4), torch.randn(8, 4)
    want = _cpu_grad(lin, x0)
    lin.zero_grad()
    with torchdoctor.virtual_devices("cuda:1"):
        x = x0.clone().requires_grad_(True)
        lin(x).sum().backward()
    assert x.grad is not None and torch.allclose(x.grad, want)


def test_a_layer_without_grad_weights_records_its_input() -> None:
    norm = nn.LayerNorm(4, elementwise_affine=False)
    x0 = torch.randn(3, 4)
    want = _cpu_grad(norm, x0)
    with torchdoctor.virtual_devices("cuda:1"):
        x = x0.clone().requires_grad_(True)
        y = norm(x)
        assert y.grad_fn is not None
        (y * torch.arange(4.0)).sum().backward()
    x1 = x0.clone().requires_grad_(True)
    (norm(x1) * torch.arange(4.0)).sum().backward()
    assert x.grad is not None and x1.grad is not None and torch.allclose(x.grad, x1.grad)
    assert want.shape == x.grad.shape


def test_without_grad_nothing_is_recorded() -> None:
    lin = nn.Linear(4, 4)
    with torchdoctor.virtual_devices("cuda:1"), torch.no_grad():
        y = lin(torch.randn(2, 4, requires_grad=True))
    assert y.grad_fn is None
