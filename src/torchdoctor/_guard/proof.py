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


def unbound(func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    """Why ``func`` cannot be called on these arguments as its schema says (a required argument missing, one too
    many, a name it does not take), or None when it can: the replay is checked before it runs, so that a failure
    of the replay itself is never shown as if it were the user's error."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return None
    params = list(schema.arguments)
    positional = [a for a in params if not a.kwarg_only]
    if len(args) > len(positional):
        return f"{len(args)} positional arguments, the schema takes {len(positional)}"
    names = {a.name for a in params}
    extra = [k for k in kwargs if k not in names]
    if extra:
        return f"no argument named {extra[0]!r}"
    for i, a in enumerate(params):
        given = (not a.kwarg_only and i < len(args)) or a.name in kwargs
        if not given and not a.has_default_value():
            return f"argument {a.name!r} missing"
    return None


_REPLAY_TEXTS = ("missing value for argument", "expected at most", "got an unexpected keyword", "Expected a value of",
                 "takes from", "positional argument", "is not a valid value for argument")


def _internal(exc: BaseException) -> bool:
    """Did the replay fail on how it was called (an argument list the op does not take), not on the data?"""
    text = str(exc)
    return isinstance(exc, TypeError) or any(x in text for x in _REPLAY_TEXTS)


def prove(func: Any, args: Sequence[Any], kwargs: Mapping[str, Any], plan: Plan, tensors: Mapping[Any, Any],
          op: Any) -> str:
    """Run the op once more with the alignment applied and say what happened, as one report line."""
    tried = "; ".join(f"{', '.join(_rules.label(op, k) for k in keys)} -> {_show(target)}"
                      for _, target, keys in plan if keys)
    if harmful(plan, tensors):
        return f"fix unproven: not tried ({tried or 'nothing to align'}): it would cast floating data to storage"
    why = unbound(func, args, kwargs)
    if why is not None:
        return f"fix unproven: the op could not be replayed ({why}); the fix is kept"
    try:
        new_args, new_kwargs = aligned(args, kwargs, plan, tensors)
        if _writes(func):  # an op that writes into an argument: the trial must not touch the user's tensors
            new_args, new_kwargs = _clones(new_args), _clones(new_kwargs)
        with torch.no_grad():
            func(*new_args, **new_kwargs)
    except Exception as exc:  # the trial's own failure is the answer, never a crash of the report
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        if _internal(exc):
            return f"fix unproven: the op could not be replayed ({type(exc).__name__}: {first}); the fix is kept"[:400]
        return f"fix unproven: tried {tried}: {type(exc).__name__}: {first}"[:400]
    return f"fix proven: {op} runs with {tried}"
