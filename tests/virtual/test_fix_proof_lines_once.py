"""A block's fix text says each line once and its verdict once: several fixes with the same code (four tensors made
on the cpu, one advice line) never repeat ``# ^ fix unproven`` under it (hunt U12, the marker's half)."""

from __future__ import annotations

import torch

from torchdoctor._virtual.prove import Fix, proof_lines


def test_a_shared_line_gets_one_verdict() -> None:
    dev = torch.device("cuda:0")
    proven = Fix("model.w.data = model.w.data.to('cuda:0')", "path", dev, sets=(("w", dev),), proven=True,
                 tried="at the failing op aten.mul.Tensor at app.py:3")
    same = [Fix("# pass the tensors made on cpu as tensor.to('cuda:0')", "input", dev, sets=((f"t{i}", dev),),
                tried="no failing op recorded reads a tensor it changes") for i in range(4)]
    lines = proof_lines([proven, *same])
    assert lines == ["model.w.data = model.w.data.to('cuda:0')",
                     "# pass the tensors made on cpu as tensor.to('cuda:0')",
                     "# ^ fix unproven: no failing op recorded reads a tensor it changes"]
