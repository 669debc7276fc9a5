"""An operand fixed at its call is the operand the op meets, never a read of its size (``enc.size(0)``), where a
``.to()`` changes nothing; and an operand is not moved to the device its op ran on when that op ran there only
because a tensor fixed the other way round was met there (a split model's top-level parameter left on cuda:0 while
the states come from cuda:1): the one fix is that tensor's, proven, never a pair that undo each other (hunt X6)."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


class Split(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.vision, self.embed = nn.Linear(6, 8), nn.Embedding(16, 8)

    def forward(self, input_ids: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
        image_features = self.vision(pixels)
        inputs_embeds = self.embed(input_ids)
        mask = (input_ids == 3).unsqueeze(-1)
        return inputs_embeds.masked_scatter(mask.expand(-1, -1, image_features.size(-1)), image_features)


def split(m: Split) -> torch.Tensor:
    m.vision.to("cuda:1")
    m.embed.to("cuda:0")
    return m(torch.tensor([[1, 3, 3, 2]], device="cuda:0"), torch.randn(1, 2, 6, device="cuda:1"))


def test_the_operand_is_moved_where_the_op_meets_it_not_in_its_size_read() -> None:
    r = torchdoctor.simulate(Split(), device="cuda:1", call=split)
    [fix] = r.fixes
    assert fix.code == "return inputs_embeds.masked_scatter(mask.expand(-1, -1, image_features.size(-1)), " \
        "image_features.to(inputs_embeds.device))", fix.code
    assert fix.proven, fix.tried


class Aura(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_tokens = nn.Parameter(torch.randn(1, 2, 8))
        self.context_embedder, self.block = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, enc: torch.Tensor) -> torch.Tensor:
        enc = self.context_embedder(enc)
        enc = torch.cat([self.register_tokens.repeat(enc.size(0), 1, 1), enc], dim=1)
        return self.block(enc)


def test_an_operand_fix_that_would_undo_the_parameter_fix_is_not_written() -> None:
    with torchdoctor.virtual_devices("cuda:0", count=2, raise_on_exit=False) as sim:
        m = Aura()
        m.register_tokens.data = m.register_tokens.data.to("cuda:0")
        m.context_embedder.to("cuda:1")
        m.block.to("cuda:1")
        m(torch.randn(2, 3, 8, device="cuda:1"))
    [fix] = sim.fixes
    assert fix.code.startswith("m.register_tokens.data = m.register_tokens.data.to('cuda:1')"), fix.code
    assert fix.proven and ".size(" not in fix.code and fix.diff is None, fix
    with torchdoctor.virtual_devices("cuda:0", count=2, raise_on_exit=False) as fixed:
        m = Aura()
        m.register_tokens.data = m.register_tokens.data.to("cuda:1")
        m.context_embedder.to("cuda:1")
        m.block.to("cuda:1")
        m(torch.randn(2, 3, 8, device="cuda:1"))
    assert fixed.ok, fixed.problems

