"""What ``move(obj, dtype=...)`` casts each tensor to: the policy's decision, seen from the cast (one formulation).

transformers keeps ``_keep_in_fp32_modules`` in fp32 as ``from_pretrained(dtype=...)`` does (its dtype plan:
non-strict names for fp16 only); quantization metadata, packed storage and tensors of plain objects are never cast.
"""

from __future__ import annotations

from typing import Any

import torch

from torchdoctor._walk import Entry

_F32 = torch.float32


def _packed(t: torch.Tensor) -> bool:
    from torchdoctor._scan.intent import packed_param  # intent imports the walker; this module stays light

    return packed_param(t)


def _storage(t: torch.Tensor) -> bool:
    from torchdoctor._scan.intent import STORAGE_DTYPES

    return t.dtype in STORAGE_DTYPES or _packed(t)


_PER_CALL = frozenset({"casts-per-call", "moved-per-call"})

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


# rules whose expected dtype is kept by design; ``move(keep_fp32=False)`` casts them as ``Module.to`` does
_BY_DESIGN = frozenset({"keep_in_fp32", "adapter", "kbit-fp32"})
_WHY = {"quant-metadata": "quantization metadata", "quant-storage": "packed storage dtype",
        "no-expectation": "tensor of a non-module object", "self-managed": "its module's own code casts it",
        "keep_in_fp32": "_keep_in_fp32_modules", "adapter": "peft adapter kept float32",
        "kbit-fp32": "prepare_model_for_kbit_training keeps it float32",
        "upcast-computed": "its forward computes with it in float32 (a buffer built in float32, never loaded)"}
_HALF = frozenset({torch.bfloat16, torch.float16})
_KEPT_RULES = _PER_CALL | {"computed-buffer"}  # rules a computed float32 buffer of such a module gets


def _upcast_computed(e: Entry) -> bool:
    """A non-persistent buffer of a module whose forward casts its computed buffers up to float32 on every call (a
    rotary embedding's ``inv_freq``, and ``original_inv_freq`` it is reset from): from_pretrained keeps them float32."""
    if e.role != "buffer" or e.module is None or not isinstance(e.key, str):
        return False
    from torchdoctor._scan.rounded import upcast_at_use

    computed = e.owner.__dict__.get("_non_persistent_buffers_set") or ()
    return e.key in computed and not upcast_at_use(type(e.module)).isdisjoint(computed)


def cast_target(policy: Any, e: Entry, keep_fp32: bool = True) -> tuple[torch.dtype, str | None]:
    """What ``move`` casts one tensor to for the policy's explicit ``dtype``, and the rule's reason when it keeps
    another dtype: read from ``policy.decide`` (``torchdoctor._scan.policy``), so that what move makes is what scan
    then expects. The alternative a decision accepts is kept only where it is a design (peft's kbit float32);
    elsewhere (a bitsandbytes bias that follows its input, a computed buffer) the cast goes to the decision's dtype,
    as ``Module.to`` does."""
    t, dtype = e.tensor, policy.dtype
    if dtype is None or not (t.is_floating_point() or t.is_complex()) or (t.is_complex() and not dtype.is_complex):
        return t.dtype, None
    d = policy.decide(e)
    if d.rule == "storage-computed" and not t.is_floating_point() or _packed(t):
        return t.dtype, _WHY["quant-storage"]  # a cast of packed data scrambles it: dequantizing is the fix
    if keep_fp32 and d.rule in _KEPT_RULES and t.dtype == _F32 and dtype in _HALF and _upcast_computed(e):
        return t.dtype, _WHY["upcast-computed"]  # from_pretrained(dtype=) keeps it so: a cast would round it
    if d.dtype is None and d.rule in _PER_CALL and e.role in ("parameter", "buffer") and not _storage(t):
        return dtype, None  # its module casts it per call, from any dtype: the cast Module.to makes is harmless
    if d.dtype is None:
        return t.dtype, _WHY.get(d.rule, "no dtype expectation")
    if not keep_fp32 and d.rule in _BY_DESIGN:
        return dtype, None
    if d.rule == "kbit-fp32" and t.dtype == d.alt_dtype:
        return t.dtype, _WHY[d.rule]
    return d.dtype, (_WHY.get(d.rule, d.rule) if d.dtype != dtype else None)
