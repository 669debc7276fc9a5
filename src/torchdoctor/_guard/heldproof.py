"""The proof of a fix for an operand held by an object the program holds (``_guard/heldarg.py``): the failing call
run again by ``useline``'s small interpreter on copies of its operands, those in the odd dtype cast; else the failing
module run again on a copy, on the arguments its call got, the holder replaced by a copy whose tensors in the odd
dtype are cast. Also the paths into such an object and the statement at a frame's line, which both modules read."""

from __future__ import annotations

import ast
import os
import types
from typing import Any

import torch
from torch import nn

from torchdoctor._placement import dtype_str

__all__ = ["odd_paths", "plain", "prove_call", "prove_module", "statement", "value_at"]

_MAX = 256  # a list or object bigger than this is not searched
_COPY_LIMIT = 256 << 20  # a holder whose tensors hold more bytes than this is not copied for a proof


_PLAIN = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, type, nn.Module,
          torch.Tensor, torch.dtype, torch.device, str, bytes, int, float, bool, complex)


def plain(v: Any) -> bool:
    """A plain object whose attributes may hold tensors (a cache, a dataclass): no tensor, module, type or scalar."""
    return v is not None and not isinstance(v, _PLAIN) and isinstance(getattr(v, "__dict__", None), dict)


def odd_paths(obj: Any, dtype: torch.dtype, depth: int = 3, at: str = "") -> list[str]:
    """Every path in ``obj`` to a tensor of ``dtype`` (what a fix must cast)."""
    attrs = getattr(obj, "__dict__", None)
    if depth <= 0 or not isinstance(attrs, dict):
        return []
    out: list[str] = []
    for name, v in list(attrs.items())[:_MAX]:
        items = list(enumerate(v))[:_MAX] if type(v) in (list, tuple) else [(None, v)]
        for i, x in items:
            here = f"{at}.{name}" + (f"[{i}]" if i is not None else "")
            if isinstance(x, torch.Tensor) and x.dtype == dtype:
                out.append(here)
            elif plain(x):
                out += odd_paths(x, dtype, depth - 1, here)
    return out



def value_at(obj: Any, path: str) -> Any:
    for part in path.replace("[", ".[").split(".")[1:]:
        obj = obj[int(part[1:-1])] if part.startswith("[") and part[1:-1].isdigit() else \
            getattr(obj, part, None) if not part.startswith("[") else None
    return obj



def statement(frame: Any, line: int) -> tuple[ast.stmt, int, list[str], str] | None:
    """(the innermost statement at ``line`` of the frame's code, the line offset, the source lines, the file)."""
    from torchdoctor._guard.maker import _parsed as parsed_code

    got = parsed_code(frame.f_code)
    if got is None:
        return None
    tree, off, path, lines = got
    best = None
    for n in ast.walk(tree):
        if isinstance(n, ast.stmt) and n.lineno + off <= line <= int(n.end_lineno or n.lineno) + off and \
                not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and (
                best is None or n.lineno >= best.lineno):
            if not any(isinstance(c, ast.stmt) for c in ast.iter_child_nodes(n)) or best is None:
                best = n
    return (best, off, lines, path) if best is not None else None



def prove_call(chain: list[tuple[Any, int]], odd: torch.dtype, ref: torch.dtype, paths: list[str]) -> str:
    """The failing call (the innermost frame outside torch and torchdoctor, its line) run again by ``useline``'s
    interpreter on copies, its operands in ``odd`` cast to ``ref``."""
    from torchdoctor._guard.useline import _NotRun, _eval  # noqa: PLC2701  (one subpackage)

    skip = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))
    inner = [(f, ln) for f, ln in chain if not f.f_code.co_filename.startswith(skip)]
    held = ", ".join(f"`{p}`" for p in paths)
    if not inner:
        return f"fix unproven: the failing call was not found to re-run with {held} -> {dtype_str(ref)}"
    frame, line = inner[-1]
    got = statement(frame, line)
    calls = [c for c in ast.walk(got[0]) if isinstance(c, ast.Call)] if got is not None else []
    call = next((c for c in calls if c.lineno + got[1] == line), calls[0] if calls else None) if got else None
    if call is None:
        return f"fix unproven: the failing call at {os.path.basename(frame.f_code.co_filename)}:{line} was not re-run"
    names = {n for n, v in frame.f_locals.items() if isinstance(v, torch.Tensor) and v.dtype == odd}
    text = ast.unparse(call)
    text = text if len(text) <= 80 else text[:77] + "..."
    where = f"{os.path.basename(frame.f_code.co_filename)}:{line}"
    tried = ", ".join(sorted(names)) + f" -> {dtype_str(ref)}"
    try:
        with torch.no_grad():
            _eval(call, frame, names, ref)
    except _NotRun as why:
        return f"fix unproven: `{text}` at {where} not re-run ({why})"
    except Exception as err:  # the trial's own failure is the answer
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return f"fix unproven: `{text}` at {where} re-run with {tried}: {type(err).__name__}: {first}"[:400]
    return f"fix proven: `{text}` at {where} runs again on copies with {tried} (what {held} hold once " \
           f"{dtype_str(ref)})"



def prove_module(chain: list[tuple[Any, int]], frame: Any, holder: Any, name: str, odd: torch.dtype,
                  ref: torch.dtype) -> str | None:
    """The failing module run again on a copy, on the arguments its call got (``Module._call_impl``'s frame on the
    traceback), ``holder`` replaced by a copy whose ``odd`` tensors are cast; None when the call is not found."""
    from torchdoctor._guard import trialcopy as copy

    from torchdoctor._guard.component import copyable

    mod = frame.f_locals.get(frame.f_code.co_varnames[0]) if frame.f_code.co_argcount else None
    call = next((f for f, _ in chain if f.f_code.co_name == "_call_impl" and f.f_locals.get("self") is mod), None)
    if not isinstance(mod, nn.Module) or call is None or "." in name or not copyable(mod):
        return None
    args, kwargs = tuple(call.f_locals.get("args", ())), dict(call.f_locals.get("kwargs", {}))
    if not any(a is holder for a in (*args, *kwargs.values())):
        return None
    if _nbytes(holder, 3) > _COPY_LIMIT:
        return f"fix unproven: `{name}` is too large to copy for a re-run of {type(mod).__name__}"
    mine = copy.deepcopy(holder)
    for p in odd_paths(mine, odd):
        parent, _, last = p.rpartition(".")
        where = value_at(mine, parent) if parent else mine
        if "[" in last:
            getattr(where, last.split("[")[0])[int(last.split("[")[1][:-1])] = value_at(mine, p).to(ref)
        else:
            setattr(where, last, getattr(where, last).to(ref))
    swap = lambda v: mine if v is holder else v.detach().clone() if isinstance(v, torch.Tensor) else v  # noqa: E731
    label = type(mod).__name__
    try:
        with torch.no_grad():
            copy.deepcopy(mod)(*map(swap, args), **{k: swap(v) for k, v in kwargs.items()})
    except Exception as err:  # the trial's own failure is the answer
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return f"fix unproven: {label} re-run on a copy with `{name}`'s {dtype_str(odd)} tensors -> " \
               f"{dtype_str(ref)}: {type(err).__name__}: {first}"[:400]
    return f"fix proven: {label} runs again on a copy, given a copy of `{name}` with its {dtype_str(odd)} tensors " \
           f"-> {dtype_str(ref)}"


def _nbytes(obj: Any, depth: int) -> int:
    """The bytes of the tensors ``obj`` holds (attributes, lists, tuples, ``depth`` objects deep)."""
    attrs = getattr(obj, "__dict__", None)
    if depth <= 0 or not isinstance(attrs, dict):
        return 0
    total = 0
    for v in list(attrs.values())[:_MAX]:
        for x in (list(v)[:_MAX] if type(v) in (list, tuple) else [v]):
            total += x.numel() * x.element_size() if isinstance(x, torch.Tensor) else _nbytes(x, depth - 1) \
                if plain(x) else 0
    return total
