"""Real-width models built on meta at a chosen depth, with inputs, for the speed rows that must hold at any depth
(issue 43): Flux's transformer, SDXL's UNet and Llama-3-8B, each at a base depth (1x) and four times it (4x).

Every builder returns ``(model, inputs)``: the model's parameters on meta, the inputs as CPU tensors (what a user
passes to ``simulate``); ``meta_inputs`` moves them to meta for the plain forward that anchors the rows.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def quiet() -> None:
    from diffusers.utils import logging as dlog
    from transformers.utils import logging as tlog

    tlog.set_verbosity_error()
    dlog.set_verbosity_error()


def flux(scale: int) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Flux width (24 heads of 128, T5 4096 text width): 2+4 blocks at 1x, 8+16 at 4x; 256 image tokens (a
    256x256 image after the VAE and 2x2 packing), 64 text tokens."""
    from diffusers import FluxTransformer2DModel

    quiet()
    with torch.device("meta"):
        model = FluxTransformer2DModel(num_layers=2 * scale, num_single_layers=4 * scale, guidance_embeds=True).eval()
    img, txt = 256, 64
    g = torch.Generator().manual_seed(0)
    return model, {"hidden_states": torch.randn(1, img, 64, generator=g),
                   "encoder_hidden_states": torch.randn(1, txt, 4096, generator=g),
                   "pooled_projections": torch.randn(1, 768, generator=g), "timestep": torch.tensor([0.5]),
                   "img_ids": torch.zeros(img, 3), "txt_ids": torch.zeros(txt, 3), "guidance": torch.tensor([3.5])}


def sdxl_unet(scale: int) -> tuple[torch.nn.Module, dict[str, Any]]:
    """SDXL's UNet at its real widths (320/640/1280 channels, 2048 cross-attention, text_time embedding); depth by
    transformer layers per block: (0, 1, 2) at 1x, (0, 4, 8) at 4x (the real model has (0, 2, 10)); a 64x64
    latent (512x512 image), 77 text tokens."""
    from diffusers import UNet2DConditionModel

    quiet()
    layers = (0, 1 * scale, 2 * scale)
    with torch.device("meta"):
        model = UNet2DConditionModel(
            sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
            block_out_channels=(320, 640, 1280), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D",
                                                                   "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
            transformer_layers_per_block=layers, attention_head_dim=(5, 10, 20), cross_attention_dim=2048,
            use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=256,
            projection_class_embeddings_input_dim=2816).eval()
    g = torch.Generator().manual_seed(0)
    return model, {"sample": torch.randn(1, 4, 64, 64, generator=g), "timestep": torch.tensor([10]),
                   "encoder_hidden_states": torch.randn(1, 77, 2048, generator=g),
                   "added_cond_kwargs": {"text_embeds": torch.randn(1, 1280, generator=g),
                                         "time_ids": torch.zeros(1, 6)}}


def llama(scale: int) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Llama-3-8B widths, 4 layers at 1x and 16 at 4x, 16 tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    quiet()
    cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=4 * scale,
                      num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                      rope_theta=500000.0)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg).eval()
    return model, {"input_ids": torch.randint(0, 128256, (1, 16), generator=torch.Generator().manual_seed(0))}


BUILDERS: dict[str, Callable[[int], tuple[torch.nn.Module, dict[str, Any]]]] = {
    "flux": flux, "sdxl": sdxl_unet, "llama": llama}
LABELS = {"flux": "Flux width (1x: 2+4 blocks)", "sdxl": "SDXL UNet widths (1x: 0/1/2 layers)",
          "llama": "Llama-3-8B width (1x: 4 layers)"}


def meta_inputs(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to("meta")
    if isinstance(x, dict):
        return {k: meta_inputs(v) for k, v in x.items()}
    return x


def fake_inputs(x: Any) -> Any:
    """The inputs as fakes (called inside a FakeTensorMode)."""
    if isinstance(x, torch.Tensor):
        return torch.empty(x.shape, dtype=x.dtype)
    if isinstance(x, dict):
        return {k: fake_inputs(v) for k, v in x.items()}
    return x
