"""An op whose output size depends on values (a boolean-mask index in a loss's backward: Wav2Vec2ForCTC's
``labels >= 0`` mask under bf16 autocast and gradient checkpointing, which torch's meta kernel refuses as
data-dependent) is an op that needs tensor values, not an op without a kernel: a meta simulate of an object that
holds data runs again on real values and a correct training step is quiet (hunt s15 V13); with ``data="meta"``
asked for, it stops and says the op needs values."""

from __future__ import annotations

import torch
from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

import torchdoctor


def _model() -> Wav2Vec2ForCTC:
    torch.manual_seed(0)
    return Wav2Vec2ForCTC(Wav2Vec2Config(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, conv_dim=(8, 8),
        conv_stride=(5, 2), conv_kernel=(10, 3), conv_bias=True, num_conv_pos_embeddings=4,
        num_conv_pos_embedding_groups=2, vocab_size=8))


def _step(m: Wav2Vec2ForCTC) -> float:
    m.to("cuda:0").train()
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    x = torch.randn(2, 1600, device="cuda:0")
    labels = torch.randint(1, 8, (2, 5), device="cuda:0")
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        loss = m(input_values=x, labels=labels).loss
    loss.backward()
    opt.step()
    return loss.item()


def test_a_ctc_training_step_runs_on_values_and_is_quiet() -> None:
    report = torchdoctor.simulate(_model(), device="cuda:0", call=_step)
    assert report.ok and report.data == "cpu", report.text()


def test_meta_asked_for_says_the_op_needs_values() -> None:
    report = torchdoctor.simulate(_model(), device="cuda:0", call=_step, data="meta")
    assert not report.ok
    [p] = [p for p in report.problems if p.kind == "unsupported_op"]
    assert "it needs tensor values; simulate with data='cpu'" in p.message, p.message
