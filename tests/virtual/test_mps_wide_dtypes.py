"""Every route that lands a float64 / complex128 tensor on MPS is a problem in a virtual MPS run (real MPS raises
``Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't support float64``)."""

import numpy as np
import pytest
import torch
from torch import nn

import torchdoctor

ROUTES = {
    "tensor of float64 numpy": lambda: torch.tensor(np.linspace(0, 1, 4), device="mps"),
    "tensor dtype=float64": lambda: torch.tensor([1.0, 2.0], dtype=torch.float64, device="mps"),
    "as_tensor of float64 numpy": lambda: torch.as_tensor(np.linspace(0, 1, 4), device="mps"),
    "asarray of float64 numpy": lambda: torch.asarray(np.linspace(0, 1, 4), device="mps"),
    "tensor of numpy float64 scalars": lambda: torch.tensor([np.float64(1.0)], device="mps"),
    "tensor of complex128 numpy": lambda: torch.tensor(np.array([1 + 2j]), device="mps"),
    "new_zeros dtype=float64": lambda: torch.ones(2, device="mps").new_zeros(3, dtype=torch.float64),
    "zeros_like dtype=float64": lambda: torch.zeros_like(torch.ones(2, device="mps"), dtype=torch.float64),
    "sum dtype=float64": lambda: torch.ones(2, device="mps").sum(dtype=torch.float64),
    "double()": lambda: torch.ones(2, device="mps").double(),
    "from numpy then to": lambda: torch.tensor(np.linspace(0, 1, 4)).to("mps"),
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_float64_on_mps_is_a_problem(route):
    with torchdoctor.virtual_devices("mps", raise_on_exit=False) as sim:
        ROUTES[route]()
    kinds = [(p.kind, p.found) for p in sim.problems]
    assert kinds and kinds[0][0] == "unsupported_dtype" and kinds[0][1] in ("float64", "complex128"), kinds


@pytest.mark.parametrize("make", [
    lambda: torch.tensor([1.0, 2.0], device="mps"),  # python floats: the default dtype, float32
    lambda: torch.tensor(np.linspace(0, 1, 4), dtype=torch.float32, device="mps"),
    lambda: torch.as_tensor(np.arange(4), device="mps"),  # int64 is fine on mps
    lambda: torch.ones(2, device="mps").new_tensor(np.linspace(0, 1, 4)),  # new_tensor keeps self's float32
    lambda: torch.ones(2, device="mps").sum(),
])
def test_float32_data_on_mps_is_clean(make):
    with torchdoctor.virtual_devices("mps", raise_on_exit=False) as sim:
        make()
    assert sim.problems == []


def test_data_factory_names_the_data_dtype():
    with torchdoctor.virtual_devices("mps", raise_on_exit=False) as sim:
        torch.tensor(np.linspace(0, 1, 4), device="mps")
    assert "torch.tensor(<float64 data>, device='mps:0') (pass dtype=torch.float32)" in sim.problems[0].message


class StyleDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.xs = np.linspace(0, 1, 4)  # float64 numpy

    def forward(self, input):
        xs = torch.tensor(self.xs, requires_grad=False, device=input.device).float()
        return self.proj(input + xs)


def test_simulate_of_a_forward_that_makes_float64_data_on_mps():
    report = torchdoctor.simulate(StyleDecoder(), (torch.randn(2, 4),), "mps")
    assert not report.ok and report.exit_code() != 0
    assert any(p.kind == "unsupported_dtype" and p.found == "float64" for p in report.problems)
    # the fix is at the factory call, never a model-wide cast: the model's own tensors are float32 already
    assert report.fix is not None and "pass dtype=torch.float32 to torch.tensor" in report.fix
    assert "model.to(" not in report.fix
