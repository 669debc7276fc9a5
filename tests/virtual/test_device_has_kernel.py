"""An op the device computes in a dtype the CPU kernel refuses (``torch.histc`` counts integers on CUDA; the CPU
says ``"histogram_cpu" not implemented for 'Long'``) runs in a virtual run with the device's result, so a correct
MoE router (Mixtral's expert counts) is quiet, never "cannot be simulated" (hunt U14)."""

from __future__ import annotations

import pytest
import torch

import torchdoctor


def test_integer_histc_on_a_virtual_gpu_counts_as_the_gpu_does() -> None:
    with pytest.raises(RuntimeError, match="not implemented for 'Long'"):  # the CPU kernel, forced both ways
        torch.histc(torch.tensor([0, 1, 1, 3]), bins=4, min=0, max=3)
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        idx = torch.tensor([[0, 1], [1, 3]], device="cuda:0")
        counts = torch.histc(idx, bins=4, min=0, max=3)
        values = counts.tolist()  # taken back to the host: the program's own numbers
    assert sim.ok and not sim.problems and values == [1, 2, 0, 1]
    assert counts.dtype == torch.int64 and counts.device == torch.device("cuda:0")
