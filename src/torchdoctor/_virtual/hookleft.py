"""Tensors hanging off the parameters of layers a program's own forward pre-hook places per call (a 4-bit weight's
``quant_state``), left where they were because the hook moves each parameter's data only (``p.data = p.data.to(
device)``: a layer-streaming loop's fast swap). The hook's line is named and the layer moved whole there (a 4-bit
weight's own ``.to`` moves its state too), never the whole model, which would undo the streaming. Proven at the
failing ops as a move of those tensors is (``atop``)."""

from __future__ import annotations

import ast
import os
import types
from typing import Any

import torch

from torchdoctor._placement import device_str, norm_device, tensor_device
from torchdoctor._virtual.prove import Fix

__all__ = ["left_by_hook"]


def left_by_hook(f: Fix, root: torch.nn.Module, layers: set[int], pre: Any, said: str) -> list[Fix] | None:
    """Tensors hanging off the parameters of layers the program's pre-hook places (a 4-bit weight's
    ``quant_state``), left where they were because the hook moves the parameters' data only (``p.data = …``):
    the hook's line named, the layer moved whole there; never the whole model."""
    target = f.sets[0][1]
    owners = [_param_of(root, n) for n, _ in f.sets]
    if not isinstance(target, torch.device) or any(o is None or id(o[0]) not in layers for o in owners):
        return None
    code = getattr(pre, "__code__", None)
    tree = parsed(pre)
    lines = sorted({code.co_firstlineno + n.lineno - 1 for n in ast.walk(tree) if isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Attribute) and t.attr == "data" for t in n.targets)}) if tree is not None and code else []
    if not lines or code is None:
        return None
    hung = ", ".join(dict.fromkeys(o[1] for o in owners if o is not None))
    first = owners[0]
    left = device_str(norm_device(tensor_device(first[2]))) if first is not None else "?"
    at = f"{short_file(code.co_filename)}:{lines[0]}"
    return [Fix(f"# `{code.co_name}` at {at} moves each parameter's data (`p.data = ...`) and not what hangs off it "
                f"({hung}), so those stay on {left} "
                f"({said}): move each layer with Module.to there (a 4-bit weight's own .to moves its "
                "quant_state too), never the whole model (that would undo the streaming)", "note", target,
                sets=f.sets)]


def _param_of(root: torch.nn.Module, path: str) -> tuple[torch.nn.Module, str, torch.Tensor] | None:
    """(the module, the attribute under its parameter, the tensor) for ``a.b.weight.quant_state.absmax``."""
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            mod = root.get_submodule(".".join(parts[:i - 1])) if i > 1 else root
        except AttributeError:
            continue
        p = (mod.__dict__.get("_parameters") or {}).get(parts[i - 1])
        if isinstance(p, torch.Tensor):
            obj: Any = p
            for k in parts[i:]:
                obj = getattr(obj, k, None)
            return (mod, ".".join(parts[i:]), obj) if isinstance(obj, torch.Tensor) and i < len(parts) else None
    return None


def parsed(fn: Any) -> ast.AST | None:
    """The source of a plain function, parsed (dedented), or None where there is none to read."""
    import inspect
    import textwrap

    if not isinstance(fn, types.FunctionType):
        return None
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None


def short_file(file: str) -> str:
    """A file as a report names it: relative to the working directory, else its base name."""
    try:
        rel = os.path.relpath(file)
    except ValueError:  # another drive
        return os.path.basename(file)
    return rel if not rel.startswith("..") else os.path.basename(file)
