"""A tensor bound for a device that cannot hold its dtype: float64 (numpy's default) on MPS. ``model.to('mps')``
itself raises there ("Cannot convert a MPS Tensor to float64 dtype"), so scan names the tensor and the cast that
must come before the move; the printed cast is applied here and the move re-run on a virtual MPS."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import torchdoctor


class PosEmbed(nn.Module):
    def __init__(self, n: int = 16, d: int = 8) -> None:
        super().__init__()
        grid = np.arange(n * d, dtype=np.float64).reshape(n, d) / (n * d)  # numpy's float64
        self.register_buffer("pos", torch.from_numpy(grid), persistent=False)
        self.lin = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x + self.pos[: x.shape[1]].float())


def _move_and_run(model: nn.Module) -> list[tuple[str, str]]:
    with torchdoctor.virtual_devices("mps", raise_on_exit=False) as sim:
        model.to("mps")
        model(torch.ones(2, 4, 8, device="mps"))
    return [(p.kind, p.found) for p in sim.problems]


def test_float64_buffer_bound_for_mps_is_named_with_the_cast_before_the_move() -> None:
    model = PosEmbed()
    assert ("unsupported_dtype", "float64") in _move_and_run(PosEmbed())  # what the move does on a Mac
    report = torchdoctor.scan(model, "mps")
    (p,) = [p for p in report.problems if p.kind == "unsupported_dtype"]
    assert (p.path, p.found, p.expected) == ("pos", "float64", "a dtype mps supports")
    assert "which mps cannot hold: moving it to mps:0 raises" in p.message
    fix = p.message.rpartition("cast it before the move: ")[2]
    assert fix == "model.pos.data = model.pos.data.to(torch.float32)"
    exec(fix, {"model": model, "torch": torch})  # the printed cast, applied
    assert torchdoctor.scan(model, "mps").problems and all(
        p.kind == "device" for p in torchdoctor.scan(model, "mps").problems)  # what is left: the move itself
    assert _move_and_run(model) == []


def test_float64_is_not_a_problem_where_the_device_holds_it() -> None:
    assert all(p.kind == "device" for p in torchdoctor.scan(PosEmbed(), "cuda:0").problems)
    assert torchdoctor.scan(PosEmbed()).ok
