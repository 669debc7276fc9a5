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
    "new_tensor dtype=float64": lambda: torch.ones(2, device="mps").new_tensor([0.5, 1.0], dtype=torch.float64),
    "new_tensor of a float64 tensor, dtype=float64": lambda: torch.ones(2, device="mps").new_tensor(
        torch.ones(2, dtype=torch.float64), dtype=torch.float64),
    "new_full dtype=float64": lambda: torch.ones(2, device="mps").new_full((3,), 2.0, dtype=torch.float64),
    "new_ones dtype=float64": lambda: torch.ones(2, device="mps").new_ones(3, dtype=torch.float64),
    "new_empty dtype=float64": lambda: torch.ones(2, device="mps").new_empty(3, dtype=torch.float64),
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
    assert "torch.tensor(<float64 data>, device='mps:0') at tests/virtual/test_mps_wide_dtypes.py:" in \
        sim.problems[0].message and " (pass dtype=torch.float32): mps cannot hold" in sim.problems[0].message


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


class NewTensors(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        h = self.proj(x)
        w = h.new_tensor([0.5, 1.0, 1.5, 2.0], dtype=torch.float64)
        b = h.new_full((4,), 2.0, dtype=torch.float64)
        return h * w.float() * b.float()


def test_a_tensor_s_own_factory_in_float64_is_named_at_its_line_and_fixed_by_dtype_there():
    import inspect

    report = torchdoctor.simulate(NewTensors(), (torch.ones(2, 4),), device="mps")
    lines, start = inspect.getsourcelines(NewTensors.forward)
    at = {name: start + next(i for i, line in enumerate(lines) if f".{name}(" in line) for name in ("new_tensor",
                                                                                                     "new_full")}
    assert [(p.kind, p.op) for p in report.problems] == [("unsupported_dtype", "Tensor.new_tensor"),
                                                         ("unsupported_dtype", "Tensor.new_full")]
    assert f"Tensor.new_tensor(dtype=float64, device='mps:0') at tests/virtual/test_mps_wide_dtypes.py:" \
           f"{at['new_tensor']}: mps cannot hold float64 tensors" in report.problems[0].message
    # new_tensor made on the device, as real PyTorch makes it: no stray cpu or meta tensor after it
    assert all(p.kind == "unsupported_dtype" for p in report.problems)
    fixes = [f for f in report.fixes if f.kind == "factory"]
    assert [f.code.split(" where ")[0] for f in fixes] == [
        f"# pass dtype=torch.float32 to Tensor.{n} at tests/virtual/test_mps_wide_dtypes.py:{at[n]}"
        for n in ("new_tensor", "new_full")]
    assert all(f.proven and f.tried == "at the factory: mps holds float32 tensors" for f in fixes)
    assert fixes[0].diff is not None and \
        "-        w = h.new_tensor([0.5, 1.0, 1.5, 2.0], dtype=torch.float64)\n" \
        "+        w = h.new_tensor([0.5, 1.0, 1.5, 2.0], dtype=torch.float32)\n" in fixes[0].diff
    assert "model.to(" not in (report.fix or "")


def test_new_tensor_on_a_virtual_tensor_stays_on_its_device_in_its_dtype():
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        x = torch.ones(2, device="cuda:1", dtype=torch.bfloat16)
        y = x.new_tensor([1.0, 2.0])
        z = x.new_tensor(np.linspace(0, 1, 3), dtype=torch.float16, requires_grad=True)
        assert (str(y.device), y.dtype, y.tolist()) == ("cuda:1", torch.bfloat16, [1.0, 2.0])
        assert (str(z.device), z.dtype, z.requires_grad) == ("cuda:1", torch.float16, True)
        (x + y).sum()
    assert sim.ok, sim.problems
