"""A tensor numpy has no dtype for (``TypeError: Got unsupported ScalarType BFloat16`` from ``.numpy()``): explained at
the user's line that converts it, with that line casting it to float32 first (``images.float().cpu().numpy()``),
proven by converting a float32 copy of the tensor the frame holds, and offered as a diff of the user's file. The later
lines of the same function that convert the same tensor (a normaliser's ``np.min``, ``np.max`` and the division) are
fixed in the same patch, each proven on a CPU copy: else every run would stop at the next of them.

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
         "mul", "add", "round", "to", "reshape", "view", "flatten", "transpose", "sub", "div", "min", "max", "mean",
         "sum", "abs"}


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
    hits = _conversions(raw, frame, None)
    if not hits:
        return None
    sites = [(lineno, raw, hits), *_later(frame, path, lineno, {h[0] for h in hits})]
    return _report(exc, frame, path, sites)


def _later(frame: Any, path: str, lineno: int, names: set[str]) -> list[tuple[int, str, list[Any]]]:
    """The lines of the same function after ``lineno`` that convert one of ``names`` (the tensors the frame holds)
    too — ``np.min(x...numpy())``, ``np.max(x...numpy())``, ``x.numpy() - ...`` — up to a line that assigns the name
    again: fixed with the failing line, or the next run fails at the next of them."""
    from torchdoctor._guard.useline import parsed_line

    out: list[tuple[int, str, list[Any]]] = []
    live = set(names)
    lines = sorted({n for _, _, n in frame.f_code.co_lines() if n is not None and n > lineno})  # (nested defs apart)
    for n in lines[:400]:
        raw = linecache.getline(path, n).rstrip("\r\n")
        hits = _conversions(raw, frame, live)
        if hits:
            out.append((n, raw, hits))
        got = parsed_line(raw)
        if got is None:
            continue
        live -= {t.id for node in ast.walk(got[0]) for t in _targets(node) if isinstance(t, ast.Name)}
        if not live:
            break
    return out


def _targets(node: ast.AST) -> list[ast.AST]:
    """The names a statement binds: assignments, ``for`` targets, ``with ... as``, walrus."""
    if isinstance(node, ast.Assign):
        return [x for t in node.targets for x in ast.walk(t)]
    if isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.NamedExpr)):
        return list(ast.walk(node.target))
    if isinstance(node, ast.withitem) and node.optional_vars is not None:
        return list(ast.walk(node.optional_vars))
    return []


def _conversions(raw: str, frame: Any, only: set[str] | None) -> list[tuple[str, torch.Tensor, int, int, str]]:
    """Each ``<name>....numpy()`` / ``np.asarray(<name>...)`` on the line whose tensor numpy cannot take (of ``only``'s
    names, when given), left to right: (the tensor's name, the tensor, the converting expression's columns, that
    expression with ``.float()`` after the tensor); one inside another is the outer one's."""
    from torchdoctor._guard.useline import parsed_line

    got = parsed_line(raw)
    if got is None:
        return []
    tree, shift = got
    out: list[tuple[str, torch.Tensor, int, int, str]] = []
    for node in ast.walk(tree):  # outer calls first
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute) or node.end_col_offset is None:
            continue
        if node.func.attr == "numpy" and not node.args:
            holder: Any = node.func  # the tensor expression is holder.value
        elif node.func.attr in _CONVERTERS and node.args:
            holder = node  # np.asarray(t): node.args[0]
        else:
            continue
        col, end = node.col_offset + shift, node.end_col_offset + shift
        if any(a <= col and end <= b for _, _, a, b, _ in out):
            continue
        parent, field = holder, "value" if holder is node.func else "args"
        root = holder.value if field == "value" else holder.args[0]
        while isinstance(root, (ast.Call, ast.Attribute)):  # images.cpu() -> images
            parent, field = (root, "func") if isinstance(root, ast.Call) else (root, "value")
            root = getattr(root, field)
        t = frame.f_locals.get(root.id) if isinstance(root, ast.Name) and (only is None or root.id in only) else None
        if not isinstance(t, torch.Tensor) or not _lacking(t.dtype):
            continue
        held: Any = ast.Name(root.id, ast.Load())
        if parent is holder and tensor_device(t).type != "cpu":  # ``x.numpy()`` of a device tensor: numpy reads
            held = ast.Call(ast.Attribute(held, "cpu", ast.Load()), [], [])  # host memory, whatever its dtype
        cast = ast.Call(ast.Attribute(held, "float", ast.Load()), [], [])
        if field == "args":
            parent.args[0] = cast
        else:
            setattr(parent, field, cast)
        out.append((root.id, t, col, end, ast.unparse(node)))
    return sorted(out, key=lambda h: h[2])


def _lacking(dtype: torch.dtype) -> bool:
    """A floating dtype numpy has no type for: bfloat16, float8 (numpy has float16, float32, float64)."""
    return dtype.is_floating_point and dtype not in (torch.float16, torch.float32, torch.float64)


def _prove(exprs: list[str], frame: Any) -> str:
    """"fix proven" when every fixed expression converts CPU copies of the tensors the frame holds; only tensor
    methods and numpy's converters are run, on the frame's plain values (sizes, numbers) and those copies."""
    import numpy as np

    said = ", ".join(f"`{e}`" for e in dict.fromkeys(exprs))
    what = f"{said} runs" if len(exprs) == 1 else f"the {len(exprs)} conversions ({said}) run"
    outs = []
    for expr in exprs:
        try:
            node = ast.parse(expr, mode="eval").body
            calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
            if not all(isinstance(c.func, ast.Attribute) and (c.func.attr in _SAFE or c.func.attr in _CONVERTERS)
                       for c in calls):
                return f"fix unproven: `{expr}` calls more than tensor methods: not re-run"
            env: dict[str, Any] = {}
            for name in {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} - {"np", "numpy"}:
                value = frame.f_locals.get(name)
                if isinstance(value, torch.Tensor):
                    with torch.no_grad():
                        value = value.detach().cpu().clone()  # a copy on the CPU (a device tensor's values)
                elif not _plain(value):
                    return f"fix unproven: `{expr}` reads `{name}`, which is not a tensor or a plain value: not re-run"
                env[name] = value
            with torch.no_grad():
                out = eval(compile(ast.Expression(node), "<fix>", "eval"),  # noqa: S307 - tensor methods only (above)
                           {"__builtins__": {}, "np": np, "numpy": np}, env)
            outs.append(f"{type(out).__name__} of {getattr(out, 'dtype', '?')}")
        except Exception as err:  # the trial's own failure is the answer
            return f"fix unproven: `{expr}` on a copy: {type(err).__name__}: " \
                   f"{str(err).splitlines()[0] if str(err) else ''}"
    copy = "" if len(exprs) == 1 else " on CPU copies"
    return f"fix proven: {what}{copy} ({', '.join(dict.fromkeys(outs))})"


def _plain(v: Any) -> bool:
    """A value the proof may hand an expression: a number, a string, None, a size, or a tuple / list of those."""
    if v is None or isinstance(v, (bool, int, float, str, torch.Size)):
        return True
    return isinstance(v, (tuple, list)) and len(v) <= 64 and all(_plain(x) for x in v)


def _report(exc: BaseException, frame: Any, path: str, sites: list[tuple[int, str, list[Any]]]) -> Any:
    from torchdoctor._guard.remedy import own_file, with_patch
    from torchdoctor._placement import dtype_str
    from torchdoctor._report.diff import line_patch, merged
    from torchdoctor._report.model import PlacementError, Problem, TensorInfo
    from torchdoctor._report.text import format_error
    from torchdoctor._rules import registry as _rules

    lineno, raw, hits = sites[0]
    name, t, col, end, _ = hits[0]
    base = os.path.basename(path)
    where = f"{base}:{lineno}"
    dt = dtype_str(t.dtype)
    head = f"dtype problem outside the guarded model, at {where}: `{raw[col:end]}` converts a {dt} tensor, and " \
           f"numpy has no {dt}"
    fixed = [(n, _rewritten(line, h)) for n, line, h in sites]
    proof = _prove([e for _, _, h in sites for *_, e in h], frame)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lines = [f"line: {raw.strip()}", f"culprit {name}: {_rules._compact(t)}  (numpy has no {dt}: cast it to float32 "
             "before converting; the device does not matter)"]
    if len(sites) > 1:  # the later conversions would fail next, one run each
        lines.append(f"{name} is converted again at " + ", ".join(f"{base}:{n}" for n, _, _ in sites[1:])
                     + ": each conversion is fixed")
    lines += [proof, f"original error: {type(exc).__name__}: {first}"]
    fix = "\n".join(f"{new.strip()}  # {base}:{n}" for n, new in fixed)
    problem = Problem("dtype", name, "input", dt, "float32", f"{name} is {dt} at {where}, and numpy has no {dt}: "
                      "cast it to float32 before converting")
    err = PlacementError(format_error(head, lines, fix), module_path=None, module_type=None, op=None,
                         tensors=[TensorInfo.of(name, t, role="input")], problems=[problem], fix=fix)
    diffs = [line_patch(path, n, new) for n, new in fixed] if own_file(path) else []
    patch = (diffs[0] if len(diffs) == 1 else merged([d for d in diffs if d])) if all(diffs) and diffs else None
    return with_patch(err, patch, lines)


def _rewritten(raw: str, hits: list[tuple[str, torch.Tensor, int, int, str]]) -> str:
    """``raw`` with each converting expression replaced by its fixed one (right to left: columns stay valid)."""
    for _, _, col, end, expr in sorted(hits, key=lambda h: -h[2]):
        raw = raw[:col] + expr + raw[end:]
    return raw
