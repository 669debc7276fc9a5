"""TorchScript modules (traced or scripted, at the top or inside a model) are walked like the modules they came
from: their ``__dict__`` holds C++-backed wrappers, or nothing at a traced model's top (hunt T21/T23: the walk
raised "descriptor 'items' for 'dict' objects doesn't apply to a 'OrderedDictWrapper' object")."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor
from torchdoctor._walk import walk


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.inner = nn.Sequential(nn.Linear(4, 4))
        self.register_buffer("pos", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.proj(x)) + self.pos


PATHS = ["proj.weight", "proj.bias", "inner.0.weight", "inner.0.bias", "pos"]


def test_traced_and_scripted_modules_are_walked_at_their_paths() -> None:
    for m in (torch.jit.trace(Block(), torch.zeros(1, 4)), torch.jit.script(Block())):
        assert [(e.path, e.role) for e in walk(m).entries] == [(p, "buffer" if p == "pos" else "parameter")
                                                                for p in PATHS], type(m).__name__
        report = torchdoctor.scan(m, device="cuda:0")
        assert sorted(p.path for p in report.problems if p.kind == "device") == sorted(PATHS)


def test_a_traced_part_of_a_model_is_found_and_judged() -> None:
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = torch.jit.trace(Block(), torch.zeros(1, 4))
            self.head = nn.Linear(4, 2)

    model = Model()
    model.enc.to(torch.float64)
    paths = [e.path for e in walk(model).entries]
    assert sorted(paths) == sorted([f"enc.{p}" for p in PATHS] + ["head.weight", "head.bias"])
    report = torchdoctor.scan(model, dtype=torch.float32)
    assert sorted(p.path for p in report.problems if p.kind == "dtype") == sorted(f"enc.{p}" for p in PATHS)
