"""A bf16-autocast training step of a real Wav2Vec2ForCTC (gradient checkpointing on, CTC loss, ``loss.item()``):
correct, so quiet. The run casts for autocast below autograd, so its backward met the forward's uncast tensors
(``native_layer_norm_backward``: bf16 against float32; group norm's "Expected scalar types of X and dY are same"):
on the device autograd casts each grad, so a backward op of a run that used autocast is cast quietly. An op with no
meta kernel (``aten._ctc_loss``, which the device has) runs on the values the run holds in a ``data='meta'``
simulate; a dtype problem in a forward under autocast is still found."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

import torchdoctor


def build() -> Wav2Vec2ForCTC:
    torch.manual_seed(0)
    cfg = Wav2Vec2Config(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                         conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), conv_bias=True,
                         num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2, vocab_size=8)
    return Wav2Vec2ForCTC(cfg)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_bf16_autocast_ctc_training_step_is_quiet(checkpointing: bool) -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        m = build().to("cuda:0").train()
        if checkpointing:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        x = torch.randn(2, 1600, device="cuda:0")
        labels = torch.randint(1, 8, (2, 5), device="cuda:0")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(input_values=x, labels=labels).loss
        loss.backward()
        loss.item()
    assert sim.problems == [], [p.message for p in sim.problems]
    assert m.lm_head.weight.grad is not None and m.lm_head.weight.grad.dtype == torch.float32


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 6)

    def forward(self, x: torch.Tensor, targets: torch.Tensor, lengths: torch.Tensor,
                target_lengths: torch.Tensor) -> torch.Tensor:
        log_probs = self.proj(x).log_softmax(-1).transpose(0, 1)
        return F.ctc_loss(log_probs, targets, lengths, target_lengths)


def ctc_step(m: nn.Module) -> torch.Tensor:
    m.to("cuda:0")
    x = torch.randn(2, 12, 4, device="cuda:0")
    targets = torch.randint(1, 6, (2, 3), device="cuda:0")
    lengths = torch.full((2,), 12, device="cuda:0")
    loss = m(x, targets, lengths, torch.full((2,), 3, device="cuda:0"))
    loss.backward()
    return loss


def test_ctc_loss_runs_in_a_meta_simulate() -> None:
    report = torchdoctor.simulate(Head(), device="cuda:0", call=ctc_step)
    assert report.ok, str(report)


def test_a_forward_dtype_problem_under_autocast_is_still_found() -> None:
    def app(m: nn.Module) -> torch.Tensor:
        m.to("cuda:0")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = m(torch.randn(2, 4, device="cuda:0"))
        return torch.mm(h, torch.randn(6, 2, device="cuda:0", dtype=torch.float64))  # autocast leaves float64 alone

    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        app(nn.Linear(4, 6))
    assert any(p.kind == "dtype" for p in sim.problems), [p.message for p in sim.problems]
