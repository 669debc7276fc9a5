"""A caller's argument made inside a library callable the program called (a feature extractor, a processor, a
tokenizer: ``input_features = fe(audio, return_tensors="pt").input_features``): its maker is the program's line
that assigned it, not the ``torch.from_numpy`` deep in the library. Read from the caller's frames and their source,
never run; the fix casts that line's value (``.to(torch.float16)``), which ``remedy`` writes as a diff."""

from __future__ import annotations

import ast
from typing import Any

import torch

from torchdoctor._guard.maker import Maker

__all__ = ["LIBCALL", "assigned_maker"]

LIBCALL = "(...)"  # a Maker's op ends so: the program's call of a callable whose result holds the tensor
_CASTS = frozenset(("float", "half", "bfloat16", "double", "to", "type"))


def assigned_maker(frames: Any, t: torch.Tensor) -> Maker | None:
    """The program's assignment of ``t`` to a local (innermost frame first) from a call's result, as a ``Maker``
    whose span is the assigned value (one line); None when no frame names it so."""
    from torchdoctor._guard.maker import _parsed
    from torchdoctor._guard.ownfile import own_file

    stack = list(frames)
    up = stack[0].f_back if stack else None
    while up is not None:  # the callers of the outermost frame a traceback shows: the program's own lines
        stack.insert(0, up)
        up = up.f_back
    for f in reversed(stack):
        names = [n for n, v in f.f_locals.items() if v is t]
        got = _parsed(f.f_code) if names and own_file(f.f_code.co_filename) else None
        if got is None:
            continue
        tree, off, file, lines = got
        best = None
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                    and node.targets[0].id in names and node.lineno + off <= f.f_lineno \
                    and (best is None or node.lineno > best.lineno):
                best = node
        if best is None or (best.value.end_lineno or 0) != best.lineno or best.value.end_col_offset is None:
            continue
        call = next((c for c in ast.walk(best.value) if isinstance(c, ast.Call)), None)
        if call is None:
            continue
        callee = ast.unparse(call.func)
        if callee.startswith("torch."):  # a torch factory: the maker's own finder names it
            continue
        if isinstance(call.func, ast.Attribute) and call.func.attr in _CASTS:  # ``...(ids).float()``: a cast the
            continue  # program wrote is its own choice, no library call's result to cast after
        raw = lines[best.lineno - 1].rstrip("\r\n")
        shift = len(raw) - len(raw.lstrip(" \t")) - best.col_offset  # the parse was dedented
        return Maker(f"{callee}{LIBCALL}", file, best.lineno + off, raw.strip(), factory=True,
                     span=(best.value.col_offset + shift, best.value.end_col_offset + shift))
    return None
