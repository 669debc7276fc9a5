"""Caller tensors made before the run are named by their argument path at any depth the caller nests them
(``kw['extra']['a'][0]``), not "a tensor made in forward"."""

from __future__ import annotations

import torch

import torchdoctor


class _Extra(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, **kw: dict[str, list[torch.Tensor]]) -> torch.Tensor:
        return self.lin(x) + kw["extra"]["a"][0] * kw["extra"]["b"][1][0]


def test_a_nested_caller_tensor_is_named_by_its_argument_path() -> None:
    left = torch.ones(2, 4)  # made on the cpu before the run, passed three containers deep
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        model = _Extra().to("cuda")
        on = torch.ones(2, 4, device="cuda")
        model(torch.ones(2, 4, device="cuda"), extra={"a": [left], "b": [on, [on]]})
    [p] = sim.problems
    assert p.kind == "device" and p.found == "cpu"
    assert p.message.startswith("kw['extra']['a'][0] (an argument of the _Extra call, made before the run) f32[2,4]@cpu")
    assert "a tensor made in forward" not in p.message
