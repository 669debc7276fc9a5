"""A fix is shown as proven only after it was tried: the failing op run again on its operands aligned as the fix
says, before the report is raised (strict) or the run goes on (fix / warn, where running the aligned op is the
proof). Nothing the user holds is changed by the trial: the aligned operands are new tensors, and an op that writes
into an argument runs on clones.

What is never offered as a fix, proven or not: a cast of a tensor to the dtype it already has (a no-op), and a cast
of a floating tensor to an integer, bool or float8 dtype (the activations would lose their values; the integer or
float8 tensor is storage that a dequantizing layer or an explicit cast must turn into the compute dtype).

>>> import torch
>>> storage_target(torch.uint8), storage_target(torch.float8_e4m3fn), storage_target(torch.bfloat16)
(True, True, False)
>>> storage_target(torch.device("cpu"))
False
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchdoctor._placement import FLOAT8_DTYPES, dtype_str
from torchdoctor._rules import registry as _rules

Plan = Sequence[tuple[Any, Any, Sequence[Any]]]  # (finding, target, offender keys)


def storage_target(target: Any) -> bool:
    """True for a dtype that floating data must never be cast to (integer, bool, float8)."""
    return isinstance(target, torch.dtype) and (not target.is_floating_point or target in FLOAT8_DTYPES)


def _show(v: Any) -> str:
    return dtype_str(v) if isinstance(v, torch.dtype) else str(v)


def harmful(plan: Plan, tensors: Mapping[Any, Any]) -> bool:
    """Would this alignment cast floating data to a storage dtype (or change nothing at all)?"""
    for _, target, keys in plan:
        for k in keys:
            t = tensors[k]
            if storage_target(target) and isinstance(t, torch.Tensor) and t.is_floating_point():
                return True
    return not any(keys for _, _, keys in plan)


def aligned(args: Sequence[Any], kwargs: Mapping[str, Any], plan: Plan, tensors: Mapping[Any, Any]
            ) -> tuple[list[Any], dict[str, Any]]:
    """The op's arguments with each offender cast or moved to its target (new tensors; the originals untouched)."""
    new_args, new_kwargs = list(args), dict(kwargs)
    put = _rules.OpArgs(new_args, new_kwargs).put
    for _, target, keys in plan:
        for k in keys:
            put(k, tensors[k].to(target))
    return new_args, new_kwargs


def _writes(func: Any) -> bool:
    schema = getattr(func, "_schema", None)
    return schema is None or bool(getattr(schema, "is_mutable", True))


def _clones(values: Sequence[Any] | Mapping[str, Any]) -> Any:
    def one(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return v.detach().clone()
        if type(v) in (list, tuple):
            return type(v)(one(x) for x in v)
        return v

    if isinstance(values, Mapping):
        return {k: one(v) for k, v in values.items()}
    return [one(v) for v in values]


def prove(func: Any, args: Sequence[Any], kwargs: Mapping[str, Any], plan: Plan, tensors: Mapping[Any, Any],
          op: Any) -> str:
    """Run the op once more with the alignment applied and say what happened, as one report line."""
    tried = "; ".join(f"{', '.join(_rules.label(op, k) for k in keys)} -> {_show(target)}"
                      for _, target, keys in plan if keys)
    if harmful(plan, tensors):
        return f"fix unproven: not tried ({tried or 'nothing to align'}): it would cast floating data to storage"
    try:
        new_args, new_kwargs = aligned(args, kwargs, plan, tensors)
        if _writes(func):  # an op that writes into an argument: the trial must not touch the user's tensors
            new_args, new_kwargs = _clones(new_args), _clones(new_kwargs)
        with torch.no_grad():
            func(*new_args, **new_kwargs)
    except Exception as exc:  # the trial's own failure is the answer, never a crash of the report
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"fix unproven: tried {tried}: {type(exc).__name__}: {first}"[:400]
    return f"fix proven: {op} runs with {tried}"
