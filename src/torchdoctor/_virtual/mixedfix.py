"""A GradScaler unscaling bfloat16 gradients (CUDA has no kernel for it) said with the program's own lines: the
scaler's maker — accelerate's ``Accelerator(mixed_precision="fp16")``, whose scaler the program never calls by name,
or the program's own ``GradScaler()`` — and the module cast that made the trained weights bfloat16
(``model.to(torch.bfloat16)``). With accelerate the fix is its setting, ``mixed_precision="bf16"`` (accelerate makes no
GradScaler for bf16), a diff of that line; a re-run (``simulate(call=)``, the marker) trains with no GradScaler and
bfloat16 autocast (``noscale``) and judges it. Never advice about ``scaler.*`` calls the program does not make."""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Iterable
from typing import Any

import torch

from torchdoctor._virtual.ownline import source

__all__ = ["scaler_fix"]

_FP16 = ("fp16", "float16")


def scaler_fix(f: Any, casts: Any, root: Any) -> Any:
    """``f``, the generic "bfloat16 gradients need no GradScaler" note, replaced by one that names the program's
    scaler maker and bfloat16 cast (a diff of accelerate's setting where the program passes it); None when ``f`` is
    another fix or the program's lines name neither."""
    from torchdoctor._virtual.restfix import SCALER_BF16

    if f.code != SCALER_BF16 or not isinstance(root, torch.nn.Module):
        return None
    cast = _bf16_cast(casts, root)
    files = _own_files(casts, cast)
    maker = next((m for file in files if (m := _maker(file)) is not None), None)
    if maker is None and cast is None:
        return None
    from torchdoctor._virtual.prove import Fix

    made = (f"bfloat16 weights made by `{cast[2]}` at {cast[1]}" if cast is not None else
            "bfloat16 weights (no cast of the program's made them so: they were loaded in bfloat16)")
    tried = ("not re-run: the program's training setup changes (no GradScaler, bfloat16 autocast); torchdoctor run runs "
             "a program once (a second run would write its files and output again): simulate(model, call=...) or "
             "@pytest.mark.simulate re-run it so")
    dev = "cuda"
    if maker is None or maker[2] == "scaler":
        where = f"the program's GradScaler (`{maker[3]}` at {maker[1]})" if maker is not None else "a GradScaler"
        drop = f"; or drop the cast at {cast[1]} (float32 master weights, float16 autocast)" if cast else ""
        return Fix(f"# {where} unscales the {made}: CUDA has no bfloat16 unscale kernel, and bfloat16 needs no loss "
                   "scaling: train them without the GradScaler (its scale(loss).backward() -> loss.backward(), "
                   f"step(optimizer) -> optimizer.step(), no update()){drop}", "note", noscale=dev, tried=tried)
    file, at, kind, text, new = maker
    from torchdoctor._report.diff import line_patch

    setting = "mixed_precision=\"fp16\"" if kind == "fp16" else \
        "mixed_precision fp16 from accelerate's config (accelerate launch --mixed_precision / ACCELERATE_MIXED_PRECISION)"
    drop = f", or drop the cast at {cast[1]} to keep float32 master weights under its fp16 autocast" if cast else ""
    diff = line_patch(file, int(at.rsplit(":", 1)[1]), new) if new is not None else None
    return Fix(f"# the GradScaler is accelerate's: `{text}` at {at} asks for {setting}, which scales the loss for "
               f"float16, while the model trains {made}; CUDA cannot unscale bfloat16 gradients, and bfloat16 needs "
               f"no loss scaling: ask accelerate for bf16 (Accelerator(mixed_precision=\"bf16\"): it makes no "
               f"GradScaler and autocasts to bfloat16){drop}", "note", noscale=dev, diff=diff, tried=tried)


def _bf16_cast(casts: Any, root: torch.nn.Module) -> tuple[str, str, str] | None:
    """(file, ``file:line``, the line's code) of the program's last bfloat16 cast of the model (or of a module
    holding it: a wrapper accelerate's ``prepare`` returns)."""
    import linecache

    if casts is None:
        return None
    mods = {id(m) for m in root.modules()}
    for ref, dtype, file, line, _at in reversed(casts.seen):
        m = ref()
        if m is not None and dtype == torch.bfloat16 and (id(m) in mods or any(x is root for x in m.modules())):
            code = linecache.getline(file, line).split("#", 1)[0].strip()
            return file, f"{os.path.basename(file)}:{line}", code
    return None


def _own_files(casts: Any, cast: tuple[str, str, str] | None) -> list[str]:
    """The program's own files a scaler's maker is looked for in: the cast's first, then those its module casts and
    moves were made in, then the script run as ``__main__``."""
    from torchdoctor._guard.ownfile import own_file

    seen: list[str] = [cast[0]] if cast is not None else []
    more: Iterable[Any] = [*(getattr(casts, "seen", None) or ()), *(getattr(casts, "moves", None) or ())]
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    for file in [*(x[2] for x in more), *([main] if isinstance(main, str) else [])]:
        if file not in seen and own_file(file):
            seen.append(file)
    return seen[:8]


def _maker(file: str) -> tuple[str, str, str, str, str | None] | None:
    """(file, ``file:line``, kind, the call's code, the line fixed or None) of the scaler's maker in ``file``:
    ``Accelerator(mixed_precision="fp16")`` (kind "fp16"), an ``Accelerator()`` whose fp16 comes from accelerate's
    config (kind "config"), or the program's own ``GradScaler(...)`` (kind "scaler")."""
    got = source(file)
    if got is None:
        return None
    tree, text = got
    lines = text.split("\n")
    short = os.path.basename(file)
    scaler = None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        code = ast.get_source_segment(text, node) or name
        at = f"{short}:{node.lineno}"
        if name == "GradScaler" and scaler is None:
            scaler = (file, at, "scaler", code, None)
        if name != "Accelerator":
            continue
        kw = next((k.value for k in node.keywords if k.arg == "mixed_precision"), None)
        raw = lines[node.lineno - 1]
        if isinstance(kw, ast.Constant) and str(kw.value).lower() in _FP16:
            new = raw[:kw.col_offset] + '"bf16"' + raw[int(kw.end_col_offset or 0):] \
                if kw.lineno == kw.end_lineno and raw.isascii() else None
            return file, f"{short}:{kw.lineno}", "fp16", code, new
        if kw is None and _state_fp16():
            new = raw[:int(node.end_col_offset or 0) - 1] + 'mixed_precision="bf16")' + \
                raw[int(node.end_col_offset or 0):] if not node.args and not node.keywords and \
                node.lineno == node.end_lineno and raw.isascii() else None
            return file, at, "config", code, new
    return scaler


def _state_fp16() -> bool:
    """accelerate's shared state says the Accelerator the program made asked for fp16."""
    state = sys.modules.get("accelerate.state")
    shared = getattr(getattr(state, "AcceleratorState", None), "_shared_state", None) or {}
    return str(shared.get("_mixed_precision", "")).lower() == "fp16"
