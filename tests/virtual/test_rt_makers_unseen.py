"""Makers a torch function mode never sees (``torch.from_numpy``, ``torch.frombuffer`` take no tensor): wrapped
for the run, so the CPU tensor they make is named by its maker and the program's line when it meets the virtual
tensors, in ``virtual_devices`` and in ``simulate``, and the fix moves it after the call (they take no
``device=``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchdoctor


class _Masked(torch.nn.Module):
    def __init__(self, maker: str) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.maker = maker

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.maker == "from_numpy":
            mask = torch.from_numpy(np.ones((2, 4), dtype=np.float32))  # MAKER LINE
        else:
            mask = torch.frombuffer(bytearray(np.ones((2, 4), dtype=np.float32).tobytes()),  # MAKER LINE
                                    dtype=torch.float32).view(2, 4)
        return self.lin(x) * mask


LINES = {m: next(i for i, ln in enumerate(open(__file__, encoding="utf-8"), 1) if "MAKER LINE" in ln and m in ln)
         for m in ("from_numpy", "frombuffer")}


@pytest.mark.parametrize("maker", ["from_numpy", "frombuffer"])
def test_a_host_data_maker_is_named_with_its_line_in_a_block(maker: str) -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        model = _Masked(maker).to("cuda")
        model(torch.ones(2, 4, device="cuda"))
    [p] = sim.problems
    assert p.kind == "device"
    assert f"a tensor made by torch.{maker} in `<root>` at " in p.message
    assert f"test_rt_makers_unseen.py:{LINES[maker]} f32[2,4]@cpu is on cpu" in p.message
    text = str(sim.error())
    assert f"torch.{maker}(...).to(x.device)" in text and "device=x.device" not in text
    assert torch.from_numpy.__module__ != __name__  # the wrapper is gone after the block
    assert torch.from_numpy(np.zeros(1)).device.type == "cpu"


def test_simulate_names_from_numpy_at_its_line() -> None:
    report = torchdoctor.simulate(_Masked("from_numpy"), torch.ones(2, 4), "cuda:0")
    [p] = report.problems
    assert "torch.from_numpy in `<root>` at " in p.message
    assert f"test_rt_makers_unseen.py:{LINES['from_numpy']} " in p.message
    assert "torch.from_numpy(...).to(x.device)" in str(report)
