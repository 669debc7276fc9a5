"""Two roots of a run that hold one path (an ``nn.Embedding``'s ``weight`` and an ``nn.Linear``'s) are each listed:
the recorder keeps a module-entry finding per path and per outermost module, so the Linear's weight is named beside
its bias, not dropped as the Embedding's again; one module called twice is still one finding per tensor."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


def test_both_weights_and_the_bias_are_listed() -> None:
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        emb = nn.Embedding(10, 4)
        emb(torch.tensor([[1, 2]]).to("cuda"))
        lin = nn.Linear(4, 4)
        lin(torch.randn(2, 4, device="cuda"))
        lin(torch.randn(2, 4, device="cuda"))  # again: nothing new
    listed = sorted((p.path, p.module_type) for p in sim.problems)
    assert listed == [("bias", "Linear"), ("weight", "Embedding"), ("weight", "Linear")], sim.problems
    lin_weight = next(p for p in sim.problems if p.path == "weight" and p.module_type == "Linear")
    assert "weight f32[4,4]@cpu is on cpu when <root> (Linear) starts on cuda:0" in lin_weight.message
    # each its own line: the Linear's weight where the Linear was called, not where the Embedding was
    lines = {k[2]: [n for f, n, _ in v if f == __file__][-1] for k, v in sim.stacks.items()
             if len(k) == 3 and k[1] == "weight"}
    assert lines["Linear"] - lines["Embedding"] == 2, sim.stacks
