"""``.numpy()`` of a tensor on a virtual GPU is named at the program's line that read it (hunt T7): the fix writes
``.cpu()`` there."""

from __future__ import annotations

import torch

import torchdoctor


def test_a_numpy_read_of_a_gpu_tensor_names_its_line() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        image = torch.rand(1, 4, 4, 3, device="cuda:0")
        line = 14; image.numpy()  # noqa: E702 - the read and its line number on one line
    [p] = sim.problems
    assert (p.kind, p.found, p.op) == ("device", "cuda:0", "Tensor.numpy")
    assert p.message.endswith(f"test_numpy_read_line.py:{line})") and "call .cpu() first (at " in p.message
