"""A model the program split over two GPUs itself (LLaVA-style: vision tower and projector on cuda:1, the language
model on cuda:0): the operand that crosses the parts is fixed at the program's call
(``image_features.to(inputs_embeds.device)``, a diff), and that fix is proven by a re-run with the line given so,
never a move of the whole model nor "not moved" parts (issue 41 points 1 and 5, hunt U3)."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


class TinyVLM(nn.Module):
    def __init__(self, fixed: bool = False) -> None:
        super().__init__()
        self.vision, self.projector = nn.Linear(6, 8), nn.Linear(8, 8)
        self.embed, self.lm = nn.Embedding(16, 8), nn.Linear(8, 16)
        self.fixed = fixed

    def forward(self, input_ids: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
        image_features = self.projector(self.vision(pixels))
        inputs_embeds = self.embed(input_ids)
        mask = (input_ids == 3).unsqueeze(-1).expand_as(inputs_embeds)
        if self.fixed:
            inputs_embeds = inputs_embeds.masked_scatter(mask, image_features.to(inputs_embeds.device))
        else:
            inputs_embeds = inputs_embeds.masked_scatter(mask, image_features)
        return self.lm(inputs_embeds)


def split(m: TinyVLM) -> torch.Tensor:
    m.vision.to("cuda:1")
    m.projector.to("cuda:1")
    m.embed.to("cuda:0")
    m.lm.to("cuda:0")
    ids = torch.tensor([[1, 3, 3, 2]], device="cuda:0")
    return m(ids, torch.randn(1, 2, 6, device="cuda:1"))


def test_the_crossing_operand_is_fixed_at_its_call_and_proven() -> None:
    r = torchdoctor.simulate(TinyVLM(), device="cuda:1", call=split)
    [p] = r.problems
    assert p.kind == "device" and p.message.startswith("image_features at tests/virtual/test_fix_operand_proven.py:")
    [fix] = r.fixes
    assert fix.code == "inputs_embeds = inputs_embeds.masked_scatter(mask, image_features.to(inputs_embeds.device))"
    # proven at the failing op (its operand moved as the line writes it), and by a re-run with the line changed
    assert fix.proven and fix.tried.startswith("at the failing op aten.masked_scatter.default at "), fix.tried
    assert fix.tried.endswith("a virtual re-run with the line changed: no problem left"), fix.tried
    assert fix.diff is not None and "+            inputs_embeds = inputs_embeds.masked_scatter(mask, " \
        "image_features.to(inputs_embeds.device))\n" in fix.diff
    assert "torchdoctor.move" not in str(r) and "not moved" not in str(r)
    assert torchdoctor.simulate(TinyVLM(fixed=True), device="cuda:1", call=split).ok  # the fix as the diff writes it
