"""What ``move(obj, dtype=...)`` casts each tensor to: the same decisions as the policy, seen from the cast.

transformers keeps ``_keep_in_fp32_modules`` in fp32 as ``from_pretrained(dtype=...)`` does (its dtype plan:
non-strict names for fp16 only); quantization metadata, packed storage and tensors of plain objects are never cast.
"""

from __future__ import annotations

from typing import Any

import torch

from torchdoctor._scan import intent
from torchdoctor._scan.intent import STORAGE_DTYPES, packed_scale
from torchdoctor._walk import Entry

_F32 = torch.float32


def fp32_scopes(w: Any, dtype: torch.dtype) -> list[tuple[str, list[str]]]:
    """``(module path, patterns)`` kept fp32 for ``dtype``, matched as from_pretrained matches them."""
    scopes = []
    for path, mod in w.modules:
        tp = type(mod)
        if not (getattr(tp, "_keep_in_fp32_modules", None) or getattr(tp, "_keep_in_fp32_modules_strict", None)
                or mod.__dict__.get("_keep_in_fp32_modules") or mod.__dict__.get("_keep_in_fp32_modules_strict")):
            continue
        dtype_plan = getattr(tp, "_get_dtype_plan", None)  # transformers: non-strict for fp16 only
        try:
            names = list(dtype_plan(mod, dtype)) if callable(dtype_plan) else list(
                getattr(tp, "_keep_in_fp32_modules", None) or mod.__dict__.get("_keep_in_fp32_modules") or [])
        except Exception:  # a library change must not break a move: fall back to the declared names
            names = list(getattr(tp, "_keep_in_fp32_modules", None) or [])
        if names:
            scopes.append((path, [n for n in names if isinstance(n, str)]))
    return scopes


def kept_fp32(path: str, scopes: list[tuple[str, list[str]]]) -> bool:
    for scope, names in scopes:
        if scope and not path.startswith(scope + "."):
            continue
        rel = f".{path[len(scope) + 1:] if scope else path}."
        if any(f".{n}." in rel for n in names):
            return True
    return False


def target_dtype(e: Entry, dtype: torch.dtype | None, fp32: Any, adapters: dict[str, bool]
                 ) -> tuple[torch.dtype, str | None]:
    """What ``move`` casts one tensor to for ``dtype``, and the rule when it keeps another dtype."""
    t = e.tensor
    if dtype is None or not (t.is_floating_point() or t.is_complex()) or (t.is_complex() and not dtype.is_complex):
        return t.dtype, None
    if e.role in ("quant_state", "offloaded", "subclass_inner") or intent.quantized_wrapper(t) \
            or intent.packed_param(t):
        return t.dtype, "quantization metadata"
    if t.dtype in STORAGE_DTYPES and not (e.role == "parameter" and intent.computes_in_storage(e.module)):
        return t.dtype, "packed storage dtype"  # (in a torch layer that computes with it, it is cast like the rest)
    if packed_scale(e):
        return t.dtype, "scale of packed storage"
    if e.role == "attribute" and (e.module is None or isinstance(e.owner, torch.Tensor)):
        return t.dtype, "tensor of a non-module object"
    if fp32 is not None:
        if adapters.get(e.path):
            return t.dtype, "peft adapter kept float32"
        if kept_fp32(e.path, fp32):
            return _F32, "_keep_in_fp32_modules"
    return dtype, None

