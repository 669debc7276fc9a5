"""float8 operands in a guarded run: the errors torch raises for them, whatever the kernel set, and the dtype
``fix`` / ``warn`` cast them to so the op can run.

float8 is storage: no op promotes it, and most CPU and GPU kernels have no float8 body. Which of the two a given
op hits first depends on the device and the CPU's kernel set: the same block of a model raises "Promotion for
Float8 Types is not supported, attempted to promote Float8_e4m3fn and BFloat16" on one x86 CPU and
``"add_stub" not implemented for 'Float8_e4m3fn'`` (NotImplementedError) on another; a GPU says
``"addmm_cuda" not implemented for 'Float8_e4m3fn'``; MPS refuses to hold the dtype at all ("Trying to convert
Float8_e4m3fn to the MPS backend but it does not have support for that dtype", a TypeError). Each one means the
same thing to a fixer: the float8 operands must be cast to a dtype torch computes in before the op.

>>> bool(is_float8_message("Promotion for Float8 Types is not supported, attempted to promote Float8_e4m3fn and Float"))
True
>>> bool(is_float8_message('"add_stub" not implemented for \\'Float8_e4m3fn\\''))
True
>>> bool(is_float8_message('"addmm_cuda" not implemented for \\'BFloat16\\''))
False
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchdoctor._placement import FLOAT8_DTYPES, dtype_str
from torchdoctor._report.model import Problem
from torchdoctor._rules import registry as _rules

FLOAT8 = FLOAT8_DTYPES

# One pattern for every form measured or reported: the promotion refusal (any device), a kernel without a float8
# body ("<kernel>" not implemented for 'Float8_*': add_stub / mul_cpu_reduced_float / sum_cpu on CPUs,
# addmm_cuda on GPUs, add_xpu / mul_xpu on Intel GPUs), and MPS refusing the dtype itself.
_TEXT = re.compile(
    r"Promotion for Float8 Types is not supported|"
    r"\"[\w:.<>-]{1,80}\" not implemented for '(?:Float8_\w{1,16})'|"
    r"Trying to convert Float8_\w{1,16} to the MPS backend")


def is_float8_message(message: str) -> bool:
    """True when ``message`` is one of torch's float8 refusals (see the module docstring)."""
    return _TEXT.search(message) is not None


def compute_dtype(dtype: torch.dtype | None) -> torch.dtype | None:
    """``dtype`` when torch computes in it, None for float8 storage (never a reference to align others to)."""
    return None if dtype is None or dtype in FLOAT8 else dtype


def float8_failure(exc: BaseException, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Did this op fail because of its float8 operands? (one is float8 and the error is a float8 refusal)"""
    if not isinstance(exc, (RuntimeError, TypeError)) or type(exc).__name__ == "PlacementError":
        return False
    if not any(t.dtype in FLOAT8 for _, t in _rules._gather(args, kwargs)):
        return False
    return is_float8_message(str(exc))


def findings(op: Any, args: Sequence[Any], kwargs: Mapping[str, Any], fallback: torch.dtype | None,
             exc: BaseException) -> list[_rules.Finding]:
    """The float8 operands of a failed op, to cast to the op's compute dtype: its other floating operands' dtype,
    else ``fallback`` (the module's dtype as scan sees it), else the default dtype. Empty when nothing to cast."""
    tensors = _rules._gather(args, kwargs)
    floats = [(k, t) for k, t in tensors if t.is_floating_point()]
    f8 = [k for k, t in floats if t.dtype in FLOAT8]
    if not f8:
        return []
    rest = [t.dtype for _, t in floats if t.dtype not in FLOAT8]
    want = rest[0] if rest else compute_dtype(fallback) or torch.get_default_dtype()
    found = dtype_str(dict(floats)[f8[0]].dtype)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    label = _rules.label(op, f8[0])
    message = (f"{op}: {label} is {found}, storage that this kernel does not compute in ({type(exc).__name__}: "
               f"{first}); cast it to {dtype_str(want)} before the op")
    problem = Problem("dtype", label, "argument", found, dtype_str(want), message, op=str(op),
                      tensors=tuple(_rules.describe_args(op, args, kwargs)))
    return [_rules.Finding(problem, "dtype", want, tuple(f8), tuple(k for k, _ in floats))]
