"""``torch.autocast("cpu")`` around a model on a virtual device casts nothing of the device's ops, as on the real
device (hunt 29, c21: a wrong ``device_type`` ran clean on virtual cuda because a virtual tensor's C++ side is a cpu
one); the device's own autocast still casts, and a real cpu op in the same region is still autocast."""

from __future__ import annotations

import pytest
import torch

import torchdoctor


@pytest.mark.parametrize("data", ["cpu", "meta"])
def test_cpu_autocast_does_not_cast_a_cuda_op(data: str) -> None:
    with torchdoctor.virtual_devices("cuda:0", data=data, raise_on_exit=False) as sim:
        lin = torch.nn.Linear(4, 4).to("cuda")
        x = torch.randn(2, 4).half().to("cuda")
        with torch.autocast("cpu", dtype=torch.float16):
            lin(x)
    assert [(p.kind, p.found, p.expected, p.op) for p in sim.problems] == [
        ("dtype", "float16", "float32", "aten.addmm.default")]


def test_the_devices_own_autocast_still_casts_and_cpu_ops_keep_cpu_autocast() -> None:
    cpu_lin = torch.nn.Linear(4, 4)
    with torchdoctor.virtual_devices("cuda:0") as sim:
        lin = torch.nn.Linear(4, 4).to("cuda")
        x = torch.randn(2, 4).half().to("cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            assert lin(x).dtype == torch.float16
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert cpu_lin(torch.randn(2, 4)).dtype == torch.bfloat16  # the program's own cpu op: autocast as ever
    assert not sim.problems
