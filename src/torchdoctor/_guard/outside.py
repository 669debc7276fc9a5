"""A placement error raised inside ``with guard(...)`` but outside any module's forward (a loss built from a
``.float()`` mask, user code combining the model's output with a tensor it made): explained at the user's line,
with the tensors that line holds and the conversion it makes, never passed through unexplained."""

from __future__ import annotations

import ast
import linecache
import operator
import os
import re
import types
from typing import Any

import torch

from torchdoctor._placement import device_str, dtype_str
from torchdoctor._report.model import PlacementError, Problem, TensorInfo
from torchdoctor._report.text import format_error
from torchdoctor._rules import registry as _rules
from torchdoctor._guard.remedy import aimed, with_patch

_TORCH = os.path.dirname(torch.__file__)
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# conversions written in the line that make a dtype or device of their own: `mask.float()`, `x.cpu()`
_CONVERTS = re.compile(r"([A-Za-z_][\w.\[\]'\"]*)\.(float|double|half|bfloat16|cpu|cuda)\(\)")
# a dispatch or function mode's hook raising the op's error is torch's machinery, not the line that called the op
_MODES = ("__torch_dispatch__", "__torch_function__")
_MADE = {"float": torch.float32, "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16}


def user_frame(tb: types.TracebackType | None) -> tuple[types.FrameType, int] | None:
    """The innermost frame of the traceback in the user's code (not torch, not torchdoctor), with its line."""
    out = None
    while tb is not None:
        name = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if not name.startswith((_TORCH, _HERE)) and tb.tb_frame.f_code.co_name not in _MODES:
            out = tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next
    return out


def explain_outside(exc: BaseException, tb: types.TracebackType | None, kind: str, maps: Any,
                    mentioned: set[Any]) -> tuple[PlacementError, str | None] | None:
    """The report of an error raised at the user's line outside any module, and its makers' lines (or None)."""
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
    # the maker of each wrong tensor the line names (a factory, a cast, a schedule table it was indexed from):
    # the fix is aimed at that line, as inside a module (_guard/remedy.py)
    aim = _aim(bad, kind, ref, maps, exc.__traceback__ or tb) if bad and ref is not None else None
    if aim is not None and aim.code:
        fix_lines.append(aim.code)
    made = {x.split(" made by ", 1)[0] for x in (aim.lines if aim is not None else [])}
    fix_lines += [f"# pass {n} as {n}.to({target})" for n, _ in bad if target is not None
                  and not (aim is not None and aim.code and n in made)]
    fix = "\n".join(dict.fromkeys(fix_lines)) or None
    makers = list(aim.lines) if aim is not None else []
    lines[-1:-1] = makers
    if fix is not None:  # the line's operator re-run on its operands with the fix applied (copies)
        lines.insert(-1, _reprove(source, frame, bad, ref))
    problems = [Problem(kind, f"{e}.{c}()", "input", dtype_str(_MADE[c]) if c in _MADE else c, expected,
                        f"{e}.{c}() at {where} makes {dtype_str(_MADE[c]) if c in _MADE else c}, expected {expected}")
                for e, c in converts]
    problems += [Problem(kind, n, "input", show(value(t)), expected, f"{n} is {show(value(t))} at {where}, "
                         f"expected {expected}") for n, t in bad]
    err = PlacementError(format_error(head, lines, fix), module_path=None, module_type=None, op=None,
                         tensors=[TensorInfo.of(n, t, role="input") for n, t in bad], problems=problems, fix=fix)
    err = with_patch(err, aim.patch if aim is not None else None, lines)
    return err, "\n".join(makers) or None


def _aim(bad: list[tuple[str, torch.Tensor]], kind: str, ref: Any, maps: Any, tb: Any) -> Any:
    """The makers of the line's wrong tensors, read from the user's frames (never by running them)."""
    try:
        return aimed([(n, t) for n, t in bad], kind, ref, maps.modules if maps is not None else {},
                     maps.dicts if maps is not None else (), None, tb)
    except Exception:  # naming the maker is extra: the failure is explained without it
        return None


_OPS: dict[type, Any] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
                         ast.Div: operator.truediv, ast.MatMult: operator.matmul, ast.Pow: operator.pow}


def _reprove(source: str, frame: types.FrameType, bad: list[tuple[str, torch.Tensor]], ref: Any) -> str:
    """"fix proven" when the line's own operator (``latents * sigma``, ``out @ w``) on names the frame holds runs
    again with the wrong tensors aligned to ``ref`` (new tensors; the user's stay as they are); "fix unproven"
    with what was tried, or why nothing was."""
    wrong = {n: t for n, t in bad}
    why = "no operator of two named tensors on the line to re-run"
    try:
        tree = ast.parse(source.rstrip(":").strip())
    except SyntaxError:
        tree = None
    for node in ast.walk(tree) if tree is not None else ():
        if not (isinstance(node, ast.BinOp) and type(node.op) in _OPS and isinstance(node.left, ast.Name)
                and isinstance(node.right, ast.Name) and {node.left.id, node.right.id} & set(wrong)):
            continue
        a, b = frame.f_locals.get(node.left.id), frame.f_locals.get(node.right.id)
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            continue
        text = ast.unparse(node)
        tried = ", ".join(f"{n} -> {dtype_str(ref) if isinstance(ref, torch.dtype) else device_str(ref)}"
                          for n in (node.left.id, node.right.id) if n in wrong)
        try:
            with torch.no_grad():
                _OPS[type(node.op)](*(t.to(ref) if n in wrong else t for n, t in ((node.left.id, a),
                                                                                  (node.right.id, b))))
        except Exception as exc:  # the trial's own failure is the answer
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return f"fix unproven: `{text}` re-run with {tried}: {type(exc).__name__}: {first}"[:400]
        return f"fix proven: `{text}` runs again with {tried}"
    return f"fix unproven: not re-run ({why})"
