"""Two modules the program never moved each start on their own (an ``nn.Embedding`` and an ``nn.Linear`` called on
cuda inputs): both have a ``weight``, so the path alone does not say whose it is. Each is moved whole by the
program's name (``emb.to('cuda:0')``, ``torchdoctor.move(lin, 'cuda:0')``), never a ``.data`` line for the one
tensor named, which left the Linear's weight behind; the program moved so is quiet."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


def test_each_module_left_on_the_cpu_is_moved_whole_by_its_name() -> None:
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        emb = nn.Embedding(10, 4)
        emb(torch.tensor([[1, 2]]).to("cuda"))
        lin = nn.Linear(4, 4)
        lin(torch.randn(2, 4, device="cuda"))
    codes = [f.code for f in sim.fixes]
    assert any(c.startswith("emb.to('cuda:0')") for c in codes), codes
    assert any(c.startswith("torchdoctor.move(lin, 'cuda:0')") for c in codes), codes
    assert not any(".data" in c for c in codes), codes
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as fixed:
        emb = nn.Embedding(10, 4)
        emb.to("cuda:0")
        emb(torch.tensor([[1, 2]]).to("cuda"))
        lin = nn.Linear(4, 4)
        torchdoctor.move(lin, "cuda:0")
        lin(torch.randn(2, 4, device="cuda"))
    assert fixed.ok, fixed.problems


def test_the_model_of_the_same_path_alone_keeps_its_fix() -> None:
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        lin = nn.Linear(4, 4)
        lin(torch.randn(2, 4, device="cuda"))
    [fix] = sim.fixes
    assert fix.code.startswith("torchdoctor.move(lin, 'cuda:0')") and fix.proven, fix
