"""Session 17, guard: a component built under accelerate's ``init_empty_weights`` and never loaded meets real data.
Its weight and bias are both on meta; one load brings both, so the fix says so once, naming both, with its code once
(the second tensor's comment used to dangle after the de-duplicated code line)."""

from __future__ import annotations

import pytest
import torch
from accelerate import init_empty_weights
from torch import nn

import torchdoctor
from torchdoctor import PlacementError


class Pipe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(8, 8)
        with init_empty_weights():
            self.image_proj = nn.Linear(8, 8)  # loaded separately: never

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.image_proj(self.encoder(x))


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_a_component_left_on_meta_is_loaded_once_in_the_fix(mode: str) -> None:
    p = Pipe()
    with pytest.raises(PlacementError) as info, torchdoctor.guard(p, mode=mode):
        p(torch.randn(2, 8))
    e = info.value
    assert sorted((q.kind, q.path) for q in e.problems) == [("meta", "image_proj.bias"), ("meta", "image_proj.weight")]
    named = ", ".join(f"model.{q.path}" for q in e.problems)  # in the order the problems are told (strict: addmm's)
    assert e.fix == (f"# {named} are on meta (no data): load their weights, e.g.\n"
                     "model.load_state_dict(state_dict, strict=False, assign=True)")
