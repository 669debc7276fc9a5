"""scan of weight-normed layers (hunt U27, issue 41 point 4): ``torch.nn.utils.weight_norm`` keeps ``weight`` as a
plain attribute that its forward pre-hook recomputes from ``weight_g`` / ``weight_v`` at every call, so after
``.to(float16)`` it is float32 until the next forward. A correct fp16 model (diffusers' Stable Audio VAE, vocoders)
is quiet; ``weight_g`` / ``weight_v`` are what is judged."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # torch deprecates the old weight_norm API


def _normed() -> nn.Module:
    return nn.Sequential(nn.utils.weight_norm(nn.Conv1d(2, 4, 3)), nn.Conv1d(4, 4, 1)).to(torch.float16)


def test_the_recomputed_weight_of_a_weight_normed_layer_is_not_judged() -> None:
    m = _normed()
    assert m[0].weight.dtype == torch.float32 and m[0].weight_g.dtype == torch.float16  # stale until a forward
    assert torchdoctor.scan(m, "cpu", torch.float16).ok
    assert torchdoctor.scan(m).ok


def test_the_stored_tensors_of_a_weight_normed_layer_still_are() -> None:
    m = _normed()
    m[0].weight_g.data = m[0].weight_g.data.float()
    m[1].extra = torch.zeros(3)  # a plain fp32 attribute of a layer without weight_norm: still flagged
    report = torchdoctor.scan(m, "cpu", torch.float16)
    assert sorted((p.kind, p.path) for p in report.problems) == [("dtype", "0.weight_g"), ("dtype", "1.extra")]


def test_a_real_fp16_audio_vae_with_weight_norm_is_quiet() -> None:
    from diffusers import AutoencoderOobleck

    vae = AutoencoderOobleck(encoder_hidden_size=8, downsampling_ratios=[2, 2], channel_multiples=[1, 2],
                             decoder_channels=8, decoder_input_channels=4, audio_channels=2).to(torch.float16)
    stale = [n for n, mod in vae.named_modules() if isinstance(getattr(mod, "weight", None), torch.Tensor)
             and "weight" not in mod._parameters and mod.weight.dtype == torch.float32]
    assert len(stale) >= 4  # the case: plain fp32 weights that the pre-hooks recompute
    report = torchdoctor.scan(vae, "cpu", torch.float16)
    assert report.ok, report.problems[:3]
