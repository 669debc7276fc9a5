"""Correct programs strict once raised on (hunt s15 V15): a convolution under autocast (autocast casts input, weight
and bias alike: the float32 master weights are what it expects), and a float32 rope table multiplied in and cast
back by `.type_as(x)` (Wan's own way). Quiet in every mode; the same mixes without autocast or without the cast
back are still problems."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor

BF = torch.bfloat16
MODES = ["explain", "strict", "warn", "fix"]


def _wav2vec2() -> nn.Module:
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    cfg = Wav2Vec2Config(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                         conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), conv_bias=True,
                         num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2, vocab_size=8)
    torch.manual_seed(0)
    return Wav2Vec2ForCTC(cfg)


@pytest.mark.parametrize("mode", MODES)
def test_a_bf16_autocast_step_with_checkpointing_is_quiet(mode: str) -> None:
    m = _wav2vec2()
    m.train()
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    x, labels = torch.randn(2, 1600), torch.randint(1, 8, (2, 5))
    with torchdoctor.guard(m, mode=mode) as g:
        with torch.autocast("cpu", dtype=BF):
            loss = m(input_values=x, labels=labels).loss
        loss.backward()
    assert g.problems == []
    assert m.wav2vec2.feature_extractor.conv_layers[1].conv.weight.dtype == torch.float32


def test_the_same_conv_mix_without_autocast_still_raises_in_strict() -> None:
    conv = nn.Sequential(nn.Conv1d(4, 4, 3))
    conv[0].bias.data = conv[0].bias.data.to(BF)
    with pytest.raises(torchdoctor.PlacementError), torchdoctor.guard(conv, mode="strict"):
        conv(torch.randn(1, 4, 8))


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2).type_as(x)


def rope_kept(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)


class Rope(nn.Module):
    def __init__(self, fn: object) -> None:
        super().__init__()
        self.fn, self.pre, self.proj, self.post = fn, nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        ang = torch.outer(torch.arange(16, dtype=torch.float32), torch.rand(4))
        self.freqs = (ang.cos(), ang.sin())  # a plain attribute kept float32 on purpose

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pre(x)
        return self.post(self.proj(self.fn(x, self.freqs[0][: x.shape[1]], self.freqs[1][: x.shape[1]])))  # type: ignore


@pytest.mark.parametrize("mode", MODES)
def test_a_float32_rope_table_cast_back_by_type_as_is_quiet(mode: str) -> None:
    torch.manual_seed(0)
    m = Rope(rope)
    for lin in (m.pre, m.proj, m.post):
        lin.to(BF)
    with torch.no_grad(), torchdoctor.guard(m, mode=mode) as g:
        out = m(torch.randn(1, 16, 8, dtype=BF))
    assert g.problems == [] and out.dtype == BF


def test_the_table_that_promotes_what_follows_is_still_a_problem_in_strict() -> None:
    torch.manual_seed(0)
    m = Rope(rope_kept)
    for lin in (m.pre, m.proj, m.post):
        lin.to(BF)
    with pytest.raises(torchdoctor.PlacementError) as info, torch.no_grad(), torchdoctor.guard(m, mode="strict"):
        m(torch.randn(1, 16, 8, dtype=BF))
    assert "promotes the model's bfloat16 to float32 silently" in str(info.value)
