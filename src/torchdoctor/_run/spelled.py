"""A fix written with the program's own names for its device and dtype.

A program that picks its device once (``device = "cuda" if torch.cuda.is_available() else "cpu"``) and its dtype
once (``dtype = torch.float16``) uses those names everywhere; a fix that writes ``'cuda:0'`` or ``torch.float16``
out works on the virtual run's device and breaks the program's own fallback (pasted, ``.to('cuda:0')`` raises "Torch
not compiled with CUDA enabled" where the program would have run on the cpu). So a device or dtype a fix writes out
is written with the program's global name for it: a module-level name whose value, when the program ended, is that
device or dtype, and whose name says what it is (``device``, ``DEVICE``, ``dev``, ``torch_device``; ``dtype``,
``weight_dtype``). In a patch the name is used only where no function of the file binds it again (a parameter or a
local of that name could hold another value there).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from typing import Any

_DEVICE = re.compile(r"""(?<![\w.])(?:torch\.device\((['"])((?:cuda|xpu|mps)(?::\d+)?)\1\)|(['"])((?:cuda|xpu|mps)(?::\d+)?)\3)""")
_DTYPE = re.compile(r"(?<![\w.])torch\.(float16|half|bfloat16|float32|float|float64|double)\b(?!\.)")
_DEV_NAME = re.compile(r"(?:^|_)dev(?:ice)?(?:$|_)", re.I)
_DTYPE_NAME = re.compile(r"(?:^|_)dtype(?:$|_)", re.I)


def _device_key(value: Any) -> tuple[str, int] | None:
    import torch

    try:
        d = torch.device(value) if isinstance(value, (str, torch.device)) else None
    except (RuntimeError, ValueError, TypeError):
        return None
    if d is None or d.type in ("cpu", "meta"):
        return None
    return d.type, d.index or 0


def _named(names: Mapping[str, Any], pattern: re.Pattern[str], key: Any, of: Any) -> str | None:
    """The one global name matching ``pattern`` whose value's ``key`` is ``of`` (``device`` / ``dtype`` first)."""
    hits = sorted((n for n, v in names.items() if not n.startswith("_") and pattern.search(n) and key(v) == of),
                  key=lambda n: (n.lower() not in ("device", "dtype"), n))
    return hits[0] if hits else None


def _dtype_key(value: Any) -> Any:
    import torch

    return value if isinstance(value, torch.dtype) else None


def _line(text: str, names: Mapping[str, Any], bound: frozenset[str]) -> str:
    """One line of code (its comment left as it is) with the program's names."""
    import torch

    if text.lstrip().startswith("#"):  # advice in words (``# pass input 0 (x) as tensor.to(torch.bfloat16)``, a
        return text  # rule quoted from the program's line): kept as written
    code, sep, comment = text.partition("  # ")

    def device(m: re.Match[str]) -> str:
        name = _named(names, _DEV_NAME, _device_key, _device_key(m.group(2) or m.group(4)))
        return name if name is not None and name not in bound else m.group(0)

    def dtype(m: re.Match[str]) -> str:
        name = _named(names, _DTYPE_NAME, _dtype_key, getattr(torch, m.group(1), None))
        return name if name is not None and name not in bound else m.group(0)

    code = _DTYPE.sub(dtype, _DEVICE.sub(device, code))
    return code + sep + comment


def spelled(code: str, names: Mapping[str, Any] | None) -> str:
    """``code`` (a fix to paste at the program's top level) with the program's names for its device and dtype."""
    if not names or ("'" not in code and '"' not in code and "torch." not in code):
        return code
    try:
        return "\n".join(_line(line, names, frozenset()) for line in code.split("\n"))
    except Exception:  # a name is an extra: the fix stands as printed
        return code


def spelled_fix(fix: Any, names: Mapping[str, Any] | None) -> None:
    """``fix`` (its code and the lines its patch adds) with the program's names, in place. A patch of a file other
    than the program's, or one whose names a function of the file binds, keeps what it writes."""
    if not names or not getattr(fix, "code", None):
        return
    diff = getattr(fix, "diff", None)
    if not diff:
        fix.code = spelled(fix.code, names)
        return
    bound = _bound_in_functions(str(names.get("__file__") or ""), diff)
    if bound is None:
        return
    try:
        lines = [_line(x, names, bound) for x in fix.code.split("\n")]
        body = [("+" + _line(x[1:], names, bound)) if x.startswith("+") and not x.startswith("+++") else x
                for x in diff.split("\n")]
    except Exception:  # a name is an extra: the fix stands as printed
        return
    fix.code, fix.diff = "\n".join(lines), "\n".join(body)


def _bound_in_functions(script: str, diff: str) -> frozenset[str] | None:
    """The names the program's script binds inside a function (parameters, locals, loop targets) when ``diff`` is a
    patch of that script; None when it is not, or the script does not parse."""
    import os

    head = next((x for x in diff.split("\n") if x.startswith("+++ ")), "")
    if not script or not head or os.path.basename(head[4:].strip()) != os.path.basename(script):
        return None
    from torchdoctor._virtual.devexpr import tree_of  # (parsed once per file for the process)

    tree = tree_of(script)
    if tree is None:
        return None
    out: set[str] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = fn.args
            out |= {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x is not None}
            out |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return frozenset(out)


__all__ = ["spelled", "spelled_fix"]
