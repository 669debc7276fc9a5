"""Pipelines: where components feed each other. In a diffusers ``DiffusionPipeline`` (or any object holding a
denoiser beside other models), a component whose compute dtype differs from the pipeline's is a problem at that
component, unless the pipeline's own code casts at that boundary: it casts text-encoder outputs to the denoiser's
dtype (``prompt_embeds.to(dtype=self.unet.dtype)``), or brings latents to the VAE's dtype / upcasts it
(``upcast_vae``, ``vae.config.force_upcast``). The pipeline's dtype is ``dtype=`` when given (then every tensor is
judged against it already), else its denoiser's. The pipeline class's source is read once per class."""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch

from torchdoctor._placement import dtype_str
from torchdoctor._report.model import Problem

DENOISERS = ("unet", "transformer", "prior", "decoder")
_SOURCES: dict[type, str] = {}


def _source(tp: type) -> str:
    hit = _SOURCES.get(tp)
    if hit is None:
        parts = []
        for klass in tp.__mro__:
            if klass is object:
                continue
            try:
                parts.append(inspect.getsource(klass))
            except (OSError, TypeError):
                continue
        hit = _SOURCES[tp] = "\n".join(parts)
    return hit


def casts_at_boundary(tp: type, name: str, denoiser: str, dtype: torch.dtype | None) -> bool:
    """The pipeline class's code casts what crosses from/to component ``name`` (read, never run)."""
    src = _source(tp)
    if not src:
        return False
    if name == "vae" or name.startswith("vae"):
        # latents brought to the VAE's own dtype before decoding, or an fp32 VAE kept by force_upcast
        if re.search(rf"\.to\([^\n]*self\.{name}\.(?:dtype|post_quant_conv)|!=\s*self\.{name}\.dtype", src):
            return True
        return dtype == torch.float32 and "force_upcast" in src
    # outputs cast to the denoiser's dtype (SDXL's prompt_embeds.to(dtype=self.unet.dtype))
    return bool(re.search(rf"\.to\([^\n]*dtype\s*=\s*self\.{denoiser}\.dtype", src)) and "encoder" in name


def pipeline_problems(obj: Any, policy: Any) -> list[Problem]:
    if policy.dtype is not None or isinstance(obj, torch.nn.Module):
        return []
    comps = {c.path: c for c in policy.components if c.path and "." not in c.path}
    denoiser = next((n for n in DENOISERS if n in comps and comps[n].dtype is not None), None)
    if denoiser is None or len(comps) < 2:
        return []
    want = comps[denoiser].dtype
    out = []
    for name, c in sorted(comps.items()):
        if name == denoiser or c.dtype is None or c.dtype == want or not c.dtype.is_floating_point:
            continue
        if casts_at_boundary(type(obj), name, denoiser, c.dtype):
            continue
        cls = type(c.module).__name__
        found, exp = dtype_str(c.dtype), dtype_str(want)
        fix = (f"pipe.{name}.to(torch.{exp})  # or load it in the pipeline's dtype: "
               f"{cls}.from_pretrained(..., torch_dtype=torch.{exp})")
        out.append(Problem(
            "dtype", name, "component", found, exp,
            f"'{name}' ({cls}) computes in {found} but the pipeline runs in {exp} (its {denoiser}'s dtype), and "
            f"{type(obj).__name__}'s code does not cast at this boundary: what '{name}' passes on (or receives) "
            f"meets {exp} weights. Fix: {fix}", None, name, cls, (f"{name}: {found}",)))
    return out


__all__ = ["DENOISERS", "casts_at_boundary", "pipeline_problems"]
