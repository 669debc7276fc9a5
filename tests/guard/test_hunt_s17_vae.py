"""Session 17, guard: a diffusers VAE kept in float32 on purpose (its config sets ``force_upcast``) decodes latents
the caller made in bfloat16. The VAE is the model guarded, so no "rest of the model" fed it: the latents are the odd
ones, cast where the program hands them to the VAE, never by casting the VAE (that brings back the overflow it
avoids). A float32 model with no such declaration fed bf16 data is still cast
(tests/realworld/test_reports_blame.py)."""

from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKL

import torchdoctor
from torchdoctor import PlacementError


def _vae() -> AutoencoderKL:
    torch.manual_seed(0)
    return AutoencoderKL(block_out_channels=(8,), down_block_types=("DownEncoderBlock2D",),
                         up_block_types=("UpDecoderBlock2D",), latent_channels=4, norm_num_groups=8,
                         layers_per_block=1)


def test_latents_fed_to_a_float32_vae_are_fixed_where_they_are_made() -> None:
    vae = _vae()
    assert vae.config.force_upcast is True
    latents = torch.randn(1, 4, 8, 8, dtype=torch.bfloat16)
    with pytest.raises(PlacementError) as info, torchdoctor.guard(vae):
        vae.decode(latents / vae.config.scaling_factor)
    e, text = info.value, str(info.value)
    # cast where the VAE is handed them: the latents' maker may feed other components (a denoiser) that need them so
    assert e.fix is not None and e.fix.startswith("vae.decode(latents.to(vae.dtype) / vae.config.scaling_factor)  # "
                                                  "test_hunt_s17_vae.py:"), text
    assert "latents cast where vae is handed it" in e.fix
    assert "odd one out, not its inputs" not in text and "vae.to(" not in e.fix and "model.to(" not in e.fix
    assert "`AutoencoderKL` computes in float32 on purpose (its config sets force_upcast)" in text
    assert "fix proven: Conv2d runs on the inputs it failed on cast to float32" in text
    assert "+        vae.decode(latents.to(vae.dtype) / vae.config.scaling_factor)\n" in (e.patch or ""), e.patch
    assert all(p.role != "component" for p in e.problems)
    with torchdoctor.guard(vae):  # the printed fix, applied: the same decode is quiet
        exec(e.fix.split("  #")[0], {"vae": vae, "latents": latents})
    assert all(t.dtype == torch.float32 for t in vae.parameters())  # the VAE stays float32


def test_strict_never_casts_a_vae_kept_in_float32() -> None:
    vae = _vae()
    latents = torch.randn(1, 4, 8, 8, dtype=torch.bfloat16)
    with pytest.raises(PlacementError) as info, torchdoctor.guard(vae, mode="strict"):
        vae.decode(latents / vae.config.scaling_factor)
    e = info.value
    assert e.fix is not None and ".to(torch.bfloat16)" not in e.fix, e.fix
    assert e.fix.startswith("vae.decode(latents.to(vae.dtype) / vae.config.scaling_factor)  # "), e.fix  # float32
    assert all(p.role != "component" for p in e.problems)
