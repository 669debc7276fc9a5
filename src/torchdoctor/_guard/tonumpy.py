"""A tensor numpy has no dtype for (``TypeError: Got unsupported ScalarType BFloat16`` from ``.numpy()``): explained at
the user's line that converts it, with that line casting it to float32 first (``images.float().cpu().numpy()``),
proven by converting a float32 copy of the tensor the frame holds, and offered as a diff of the user's file.

numpy has no bfloat16 and no float8, whatever the device: the conversion fails on the CPU too, so the fix is a cast
before the conversion, never a move.
"""

from __future__ import annotations

import ast
import linecache
import os
import re
import types
from typing import Any

import torch

from torchdoctor._placement import tensor_device

_REFUSED = re.compile(r"unsupported ScalarType (\w+)")
_CONVERTERS = {"asarray", "array", "ascontiguousarray"}  # np.asarray(t): the tensor is the first argument
# tensor methods a converting expression may chain (re-run for the proof on a copy; nothing else is ever called)
_SAFE = {"cpu", "detach", "float", "numpy", "contiguous", "clone", "squeeze", "unsqueeze", "permute", "clamp",
         "mul", "add", "round", "to"}


def explain_numpy(exc: BaseException, tb: types.TracebackType | None) -> Any:
    """The report (a ``PlacementError``) of a tensor converted to numpy in a dtype numpy lacks, or None when the
    message is another one or the converting expression cannot be read."""
    from torchdoctor._guard.outside import user_frame

    said = _REFUSED.search(str(exc))
    found = user_frame(exc.__traceback__ or tb) if said else None
    if found is None:
        return None
    frame, lineno = found
    path = frame.f_code.co_filename
    raw = linecache.getline(path, lineno).rstrip("\r\n")
    hit = _conversion(raw, frame)
    if hit is None:
        return None
    name, t, col, end, new_expr = hit
    return _report(exc, frame, path, lineno, raw, name, t, col, end, new_expr)


def _conversion(raw: str, frame: Any) -> tuple[str, torch.Tensor, int, int, str] | None:
    """(the tensor's name, the tensor, columns of the converting expression, that expression with ``.float()``
    after the tensor) for the first ``<name>....numpy()`` / ``np.asarray(<name>...)`` on the line whose tensor numpy
    cannot take."""
    from torchdoctor._guard.useline import parsed_line

    got = parsed_line(raw)
    if got is None:
        return None
    tree, shift = got
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute) or node.end_col_offset is None:
            continue
        if node.func.attr == "numpy" and not node.args:
            holder: Any = node.func  # the tensor expression is holder.value
        elif node.func.attr in _CONVERTERS and node.args:
            holder = node  # np.asarray(t): node.args[0]
        else:
            continue
        parent, field = holder, "value" if holder is node.func else "args"
        root = holder.value if field == "value" else holder.args[0]
        while isinstance(root, (ast.Call, ast.Attribute)):  # images.cpu() -> images
            parent, field = (root, "func") if isinstance(root, ast.Call) else (root, "value")
            root = getattr(root, field)
        t = frame.f_locals.get(root.id) if isinstance(root, ast.Name) else None
        if not isinstance(t, torch.Tensor) or not _lacking(t.dtype):
            continue
        col, end = node.col_offset + shift, node.end_col_offset + shift
        held: Any = ast.Name(root.id, ast.Load())
        if parent is holder and tensor_device(t).type != "cpu":  # ``x.numpy()`` of a device tensor: numpy reads
            held = ast.Call(ast.Attribute(held, "cpu", ast.Load()), [], [])  # host memory, whatever its dtype
        cast = ast.Call(ast.Attribute(held, "float", ast.Load()), [], [])
        if field == "args":
            parent.args[0] = cast
        else:
            setattr(parent, field, cast)
        return root.id, t, col, end, ast.unparse(node)
    return None


def _lacking(dtype: torch.dtype) -> bool:
    """A floating dtype numpy has no type for: bfloat16, float8 (numpy has float16, float32, float64)."""
    return dtype.is_floating_point and dtype not in (torch.float16, torch.float32, torch.float64)


def _prove(new_expr: str, name: str, t: torch.Tensor) -> str:
    """"fix proven" when the fixed expression converts a copy of the tensor; only tensor methods are run."""
    try:
        node = ast.parse(new_expr, mode="eval").body
        calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
        if not all(isinstance(c.func, ast.Attribute) and (c.func.attr in _SAFE or c.func.attr in _CONVERTERS)
                   for c in calls):
            return f"fix unproven: `{new_expr}` calls more than tensor methods: not re-run"
        import numpy as np

        with torch.no_grad():
            out = eval(compile(ast.Expression(node), "<fix>", "eval"),  # noqa: S307 - tensor methods only (above)
                       {"__builtins__": {}, "np": np, "numpy": np}, {name: t.detach().clone()})
        return f"fix proven: `{new_expr}` runs ({type(out).__name__} of {getattr(out, 'dtype', '?')})"
    except Exception as err:  # the trial's own failure is the answer
        return f"fix unproven: `{new_expr}` on a copy: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def _report(exc: BaseException, frame: Any, path: str, lineno: int, raw: str, name: str, t: torch.Tensor, col: int,
            end: int, new_expr: str) -> Any:
    from torchdoctor._guard.remedy import own_file, with_patch
    from torchdoctor._placement import dtype_str
    from torchdoctor._report.diff import line_patch
    from torchdoctor._report.model import PlacementError, Problem, TensorInfo
    from torchdoctor._report.text import format_error
    from torchdoctor._rules import registry as _rules

    where = f"{os.path.basename(path)}:{lineno}"
    dt = dtype_str(t.dtype)
    new_line = raw[:col] + new_expr + raw[end:]
    head = f"dtype problem outside the guarded model, at {where}: `{raw[col:end]}` converts a {dt} tensor, and " \
           f"numpy has no {dt}"
    proof = _prove(new_expr, name, t)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lines = [f"line: {raw.strip()}", f"culprit {name}: {_rules._compact(t)}  (numpy has no {dt}: cast it to float32 "
             "before converting; the device does not matter)", proof, f"original error: {type(exc).__name__}: {first}"]
    fix = f"{new_line.strip()}  # {where}"
    problem = Problem("dtype", name, "input", dt, "float32", f"{name} is {dt} at {where}, and numpy has no {dt}: "
                      "cast it to float32 before converting")
    err = PlacementError(format_error(head, lines, fix), module_path=None, module_type=None, op=None,
                         tensors=[TensorInfo.of(name, t, role="input")], problems=[problem], fix=fix)
    return with_patch(err, line_patch(path, lineno, new_line) if own_file(path) else None, lines)
