"""A ComfyUI fp8_scaled checkpoint (float8 ``*.weight``, float32 ``*.scale_weight`` / ``scale_input`` beside each, the
``scaled_fp8`` marker): the scales are float32 by design, never a dtype problem, and the advice for what else is off
never casts the whole model (that would cast the float8 weights and their scales too)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

import torchdoctor

F8 = torch.float8_e4m3fn


def _file(tmp_path: Path, fp8: bool = True) -> str:
    sd: dict[str, torch.Tensor] = {}
    for i in range(3):
        p = f"model.diffusion_model.blocks.{i}"
        sd[f"{p}.attn.qkv.weight"] = torch.randn(8, 8).to(F8 if fp8 else torch.bfloat16)
        if fp8:
            sd[f"{p}.attn.qkv.scale_weight"] = torch.ones(1)
            sd[f"{p}.attn.qkv.scale_input"] = torch.ones(1)
        sd[f"{p}.attn.qkv.bias"] = torch.zeros(8, dtype=torch.bfloat16)
        sd[f"{p}.norm.weight"] = torch.ones(8)
    if fp8:
        sd["model.diffusion_model.scaled_fp8"] = torch.empty(0, dtype=F8)
    path = tmp_path / "model.safetensors"
    save_file(sd, str(path))
    return str(path)


def test_scales_of_float8_weights_are_not_judged_and_the_advice_casts_only_what_is_off(tmp_path: Path) -> None:
    path = _file(tmp_path)
    assert torchdoctor.scan(path).ok
    [p] = torchdoctor.scan(path, dtype="bfloat16").problems
    assert (p.kind, p.found, p.expected) == ("dtype", "float32", "bfloat16")
    assert all(".norm.weight" in t for t in p.tensors) and len(p.tensors) == 3
    assert "cast only these tensors to bfloat16 when loading" in p.message
    assert "model-wide model.to(torch.bfloat16) would cast too" in p.message


def test_without_float8_weights_the_advice_is_the_model_wide_cast(tmp_path: Path) -> None:
    [p] = torchdoctor.scan(_file(tmp_path, fp8=False), dtype="bfloat16").problems
    assert "cast when loading: from_pretrained(..., dtype=torch.bfloat16) or model.to(torch.bfloat16)" in p.message
