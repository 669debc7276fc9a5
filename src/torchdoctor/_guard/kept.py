"""The guarded model computes in float32 on purpose (a diffusers VAE whose config sets ``force_upcast``) and its
caller feeds it data in another dtype: the data is the odd one out, fixed at the line that made it, never by casting
the model (that brings back the overflow float32 avoids). ``_guard/component.py`` blames the component otherwise."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from torchdoctor._guard.remedy import Aim


def kept_float32(root: Any, comp: str) -> bool:
    """The guarded model itself (``comp`` ``""``: no rest of the model fed it, its caller did) says it computes in
    float32 on purpose: a diffusers VAE whose config sets ``force_upcast`` (an SDXL VAE overflows in half
    precision). The caller's data in another dtype is then the odd one out, fixed where it is made, never by casting
    the model. A component of a pipeline fed by its neighbours is still the odd one out (``_guard/component.py``)."""
    config = getattr(root, "config", None) if not comp and isinstance(root, nn.Module) else None
    try:
        up = config.get("force_upcast") if isinstance(config, Mapping) else getattr(config, "force_upcast", None)
    except Exception:  # a config that cannot be read: no such declaration
        return False
    return up is True


def kept_upcast(comp: Any) -> bool:
    """``comp`` says it computes in float32 on purpose (``kept_float32``) and every floating tensor of it is float32."""
    try:
        return isinstance(comp, nn.Module) and kept_float32(comp, "") and all(
            t.dtype == torch.float32 for t in (*comp.parameters(), *comp.buffers()) if t.is_floating_point())
    except Exception:  # a strange module: not kept
        return False


def kept_site(tb: Any, mod: Any, odd: tuple[str, torch.dtype] | None, ref: Any) -> Any:
    """The program's line on traceback ``tb`` that hands data in ``odd``'s dtype to a component holding ``mod`` that
    is kept in float32 on purpose (``ref``: the dtype the failing op expected), a ``usecall.Site``; else None."""
    from torchdoctor._guard.usecall import use_site

    if odd is None or ref != torch.float32 or not isinstance(mod, nn.Module):
        return None
    site = use_site(tb, mod, "dtype", odd[1])
    return site if site is not None and kept_upcast(site.comp) else None


def kept_fix(callers: Sequence[tuple[str, Any]], mod: Any, inputs: Sequence[Any], odd: torch.dtype,
             paths: Mapping[int, str], dicts: Collection[str]) -> tuple[str, str | None, str] | None:
    """(fix, patch, proof) for data fed in ``odd`` to a component kept in float32 on purpose: the line that made it
    gives float32 (``latents = torch.randn(..., dtype=torch.float32)``), proven by the failing module called on its
    inputs with those in ``odd`` cast; None when no maker's line can say it."""
    from torchdoctor._guard.remedy import remedy

    for _, m in callers:
        fix = remedy(m, torch.float32, dict(paths), dicts)
        if fix is None or fix.code.startswith("# make") and not fix.patch:
            continue
        code = fix.code
        if code.startswith("#") and fix.patch:  # the fixed line itself, from its diff
            new = [x[1:] for x in fix.patch.splitlines() if x.startswith("+") and not x.startswith("+++")]
            code = f"{new[0].strip()}  # {m.file.rsplit('/', 1)[-1]}:{m.line}" if len(new) == 1 else code
        return code, fix.patch, _tried(mod, inputs, odd)
    return None


def kept_aim(odd: tuple[str, torch.dtype], root: Any, callers: Sequence[tuple[str, Any]], mod: Any,
             inputs: Sequence[Any], maps: Any, site: Any = None) -> Aim | None:
    """explain's aim for a component kept in float32: the data cast where the program's line hands it over
    (``site``, a ``usecall.Site``: the maker's tensor may feed other components, which need it as it is), else the
    maker's line given float32; proven on the failing module; None otherwise."""
    comp = site.comp if site is not None else root
    said = (f"`{type(comp).__name__}` computes in float32 on purpose (its config sets force_upcast): "
            "the data fed to it is cast, never the component")
    if site is not None:
        from torchdoctor._report.diff import line_patch

        short = site.file.replace(chr(92), "/").rsplit("/", 1)[-1]
        code = f"{site.new}  # {short}:{site.line}: {', '.join(site.names)} cast where {site.recv} is handed it"
        proof = _tried(mod, inputs, odd[1]) + " (guard re-runs the failing layer, not the whole program)"
        return Aim([said], code, line_patch(site.file, site.line, site.new), proof, [])
    kept = kept_fix(callers, mod, inputs, odd[1], maps.modules, maps.dicts)
    if kept is None:
        return None
    return Aim([said], kept[0], kept[1], kept[2], [])


def _tried(mod: Any, inputs: Sequence[Any], odd: torch.dtype) -> str:
    """The failing module called on its inputs with those in ``odd`` cast to float32: the proof's line."""
    label = type(mod).__name__
    if not isinstance(mod, nn.Module) or not inputs:
        return "fix unproven: the failing module's inputs are not known"
    try:
        with torch.no_grad():
            mod(*[x.float() if isinstance(x, torch.Tensor) and x.dtype == odd else x for x in inputs])
    except Exception as exc:  # the trial's own failure is the answer, never a crash of the report
        return f"fix unproven: {label} on its inputs in float32: {type(exc).__name__}"[:400]
    return f"fix proven: {label} runs on the inputs it failed on cast to float32"
