"""An op the real backend has no kernel for (MPS's ``_int_mm``: "NotImplementedError: The operator 'aten::_int_mm'
is not currently implemented for the MPS device") is a problem on the virtual device, at the user's line, with the
fallback flag and the path without it; CUDA, which has the kernel, stays quiet."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


class Int8Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", torch.randint(-127, 127, (32, 32), dtype=torch.int8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.abs().amax() / 127
        xq = (x / s).round().clamp(-128, 127).to(torch.int8)
        y = torch._int_mm(xq, self.weight.t())  # the op MPS lacks
        return y.to(x.dtype) * s


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.out = Int8Linear(), nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.q(x))


def test_int_mm_on_virtual_mps_is_a_missing_kernel_at_its_line() -> None:
    report = torchdoctor.simulate(Net(), (torch.randn(32, 32),), device="mps", dtype=torch.float16)
    assert not report.ok
    missing = [p for p in report.problems if p.kind == "missing_kernel"]
    assert len(missing) == 1 and missing[0].found == "aten::_int_mm" and missing[0].path == "q"
    msg = missing[0].message
    assert "test_missing_kernel.py:" in msg and "mps has no kernel for aten::_int_mm" in msg
    assert "The operator 'aten::_int_mm' is not currently implemented for the MPS device" in msg
    assert "PYTORCH_ENABLE_MPS_FALLBACK=1" in msg and "dequantize" in msg


def test_int_mm_on_virtual_cuda_is_quiet_and_so_is_a_block_without_it() -> None:
    assert torchdoctor.simulate(Net(), (torch.randn(32, 32),), device="cuda", dtype=torch.float16).ok
    plain = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    assert torchdoctor.simulate(plain, (torch.randn(2, 8),), device="mps").ok


def test_virtual_devices_block_records_it_too() -> None:
    with torchdoctor.virtual_devices("mps", raise_on_exit=False) as sim:
        m = Net().to("mps", torch.float16)
        m(torch.randn(32, 32, device="mps", dtype=torch.float16))
    kinds = {p.kind: p for p in sim.problems}
    assert "missing_kernel" in kinds and "PYTORCH_ENABLE_MPS_FALLBACK=1" in kinds["missing_kernel"].message
