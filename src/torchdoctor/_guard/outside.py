"""A placement error raised inside ``with guard(...)`` but outside any module's forward (a loss built from a
``.float()`` mask, user code combining the model's output with a tensor it made): explained at the user's line,
with the tensors that line holds and the conversion it makes, never passed through unexplained."""

from __future__ import annotations

import linecache
import os
import re
import types
from typing import Any

import torch

from torchdoctor._placement import device_str, dtype_str
from torchdoctor._report.model import PlacementError, Problem, TensorInfo
from torchdoctor._report.text import format_error
from torchdoctor._rules import registry as _rules

_TORCH = os.path.dirname(torch.__file__)
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# conversions written in the line that make a dtype or device of their own: `mask.float()`, `x.cpu()`
_CONVERTS = re.compile(r"([A-Za-z_][\w.\[\]'\"]*)\.(float|double|half|bfloat16|cpu|cuda)\(\)")
_MADE = {"float": torch.float32, "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16}


def user_frame(tb: types.TracebackType | None) -> tuple[types.FrameType, int] | None:
    """The innermost frame of the traceback in the user's code (not torch, not torchdoctor), with its line."""
    out = None
    while tb is not None:
        name = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if not name.startswith((_TORCH, _HERE)):
            out = tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next
    return out


def explain_outside(exc: BaseException, tb: types.TracebackType | None, kind: str, maps: Any,
                    mentioned: set[Any]) -> PlacementError | None:
    found_frame = user_frame(exc.__traceback__ or tb)
    if found_frame is None:
        return None
    frame, lineno = found_frame
    where = f"{os.path.basename(frame.f_code.co_filename)}:{lineno}"
    source = linecache.getline(frame.f_code.co_filename, lineno).strip()
    dtype = kind in ("dtype", "unsupported_dtype")

    def value(t: torch.Tensor) -> Any:
        return t.dtype if dtype else _rules._norm(_rules.tensor_device(t))

    def show(v: Any) -> str:
        return dtype_str(v) if isinstance(v, torch.dtype) else device_str(v)

    used = set(re.findall(r"[A-Za-z_]\w*", source))  # the line's own names: a stale local is not an operand
    named = [(n, v) for n, v in frame.f_locals.items() if isinstance(v, torch.Tensor) and n in used]
    pool = [(n, t) for n, t in named if not dtype or t.is_floating_point()]
    ref = (maps.dtype if dtype else maps.device) if maps is not None else None
    values = [value(t) for _, t in pool]
    if ref is None or (ref not in values and ref not in mentioned):
        ref = max(values, key=values.count) if values else ref
    bad = [(n, t) for n, t in pool if ref is not None and value(t) != ref]
    converts = [(m.group(1), m.group(2)) for m in _CONVERTS.finditer(source)]
    converts = [(e, c) for e, c in converts if (c in _MADE) == dtype and _MADE.get(c, None) != ref]
    found = ", ".join(dict.fromkeys(show(value(t)) for _, t in bad)) or (
        ", ".join(dict.fromkeys(dtype_str(_MADE[c]) if c in _MADE else c for _, c in converts)) or None)
    expected = show(ref) if ref is not None else "?"
    head = f"{kind} mismatch outside the guarded model, at {where}" + (
        f": {found} where {expected} was expected" if found else "")
    lines = [f"line: {source}"] if source else []
    lines += [f"culprit {e}.{c}() makes {dtype_str(_MADE[c]) if c in _MADE else c}" for e, c in converts]
    lines += [f"culprit {n}: {_rules._compact(t)}  (expected {expected})" for n, t in bad]
    lines += [f"{n}: {_rules._compact(t)}" for n, t in pool if (n, t) not in bad][:6]
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lines.append(f"original error: {type(exc).__name__}: {first}")
    target = f"torch.{dtype_str(ref)}" if isinstance(ref, torch.dtype) else repr(show(ref)) if ref is not None else None
    fix_lines = [f"# {e}.{c}() -> {e}.to({target})" for e, c in converts if target is not None]
    fix_lines += [f"# pass {n} as {n}.to({target})" for n, _ in bad if target is not None]
    fix = "\n".join(dict.fromkeys(fix_lines)) or None
    problems = [Problem(kind, f"{e}.{c}()", "input", dtype_str(_MADE[c]) if c in _MADE else c, expected,
                        f"{e}.{c}() at {where} makes {dtype_str(_MADE[c]) if c in _MADE else c}, expected {expected}")
                for e, c in converts]
    problems += [Problem(kind, n, "input", show(value(t)), expected, f"{n} is {show(value(t))} at {where}, "
                         f"expected {expected}") for n, t in bad]
    return PlacementError(format_error(head, lines, fix), module_path=None, module_type=None, op=None,
                          tensors=[TensorInfo.of(n, t, role="input") for n, t in bad], problems=problems, fix=fix)
