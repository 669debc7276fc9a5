"""Pipelines: where components feed each other. In a diffusers ``DiffusionPipeline`` (or any object holding a
denoiser beside other models), a component whose compute dtype differs from the pipeline's is a problem at that
component, unless the pipeline's own code casts at that boundary: it casts text-encoder outputs to the denoiser's
dtype (``prompt_embeds.to(dtype=self.unet.dtype)``), or brings latents to the VAE's dtype / upcasts it
(``upcast_vae``, ``vae.config.force_upcast``). The pipeline's dtype is ``dtype=`` when given (then every tensor is
judged against it already), else its denoiser's; where the denoiser alone differs (its neighbours at that
boundary agree on another dtype, two or more of them) the denoiser is the component named, and the fix casts or
loads it. The pipeline class's source is read once per class."""

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
    tp = type(obj)
    # the components whose outputs meet the denoiser's weights as they are (no cast at that boundary)
    coupled = {name: c.dtype for name, c in comps.items() if name != denoiser and c.dtype is not None
               and c.dtype.is_floating_point and not casts_at_boundary(tp, name, denoiser, c.dtype)}
    odd = _odd_denoiser(coupled, want)
    if odd is not None:  # the denoiser is the one that differs: its neighbours agree on another dtype
        cls = type(comps[denoiser].module).__name__
        found, exp = dtype_str(want), dtype_str(odd)
        names = ", ".join(sorted(n for n, d in coupled.items() if d == odd))
        return [Problem(
            "dtype", denoiser, "component", found, exp,
            f"'{denoiser}' ({cls}) computes in {found} but the components it meets ({names}) compute in {exp}, "
            f"and {tp.__name__}'s code does not cast at these boundaries: what they pass on meets {found} weights. "
            f"Fix: {_fix(denoiser, cls, exp)}", None, denoiser, cls, (f"{denoiser}: {found}",))] + [
            _differs(tp, name, comps[name], odd, denoiser, neighbours=True) for name, d in sorted(coupled.items())
            if d != odd]
    return [_differs(tp, name, comps[name], want, denoiser) for name, d in sorted(coupled.items()) if d != want]


def _odd_denoiser(coupled: dict[str, torch.dtype], want: torch.dtype) -> torch.dtype | None:
    """The dtype the denoiser's neighbours agree on when the denoiser alone differs: at least two of them share it
    and they outnumber those in the denoiser's dtype (one neighbour against the denoiser is a tie: the denoiser's
    dtype is the pipeline's, as before)."""
    counts: dict[torch.dtype, int] = {}
    for d in coupled.values():
        counts[d] = counts.get(d, 0) + 1
    best = max(counts, key=lambda d: counts[d], default=None)
    if best is None or best == want or counts[best] < 2 or counts[best] <= counts.get(want, 0):
        return None
    return best


def _fix(name: str, cls: str, exp: str) -> str:
    return f"pipe.{name}.to(torch.{exp})  # or load it in the pipeline's dtype: {cls}.from_pretrained(..., torch_dtype=torch.{exp})"


def _differs(tp: type, name: str, c: Any, want: torch.dtype, denoiser: str, neighbours: bool = False) -> Problem:
    cls = type(c.module).__name__
    found, exp = dtype_str(c.dtype), dtype_str(want)
    why = "the other components' dtype" if neighbours else f"its {denoiser}'s dtype"
    return Problem(
        "dtype", name, "component", found, exp,
        f"'{name}' ({cls}) computes in {found} but the pipeline runs in {exp} ({why}), and "
        f"{tp.__name__}'s code does not cast at this boundary: what '{name}' passes on (or receives) "
        f"meets {exp} weights. Fix: {_fix(name, cls, exp)}", None, name, cls, (f"{name}: {found}",))


__all__ = ["DENOISERS", "casts_at_boundary", "pipeline_problems"]
