"""The tensors the program's own line reads by name when an op fails there: each local's name, device, the names of
what made it (the tags its operand twin would carry; a real cpu tensor's maker the run kept), its shape, and whether
a statement in its frame may bind it again. Kept on ``atop.Case`` (a failing op only, at most ``atop.CASES`` per run),
read by ``meetsite`` to write a fix with the line's own names (``mask = mask.to(image1.device)``)."""

from __future__ import annotations

import ast
import linecache
import sys
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["Named", "line_names"]


class Named:
    """A local the failing line reads: its name, device, the names of what made it, and whether a statement in
    its frame may bind it again (a local or a module-level name; a global read inside a function may not)."""

    __slots__ = ("name", "device", "tags", "local", "shape", "dtype")

    def __init__(self, name: str, device: torch.device, tags: tuple[str, ...], local: bool,
                 shape: tuple[int, ...] = (), dtype: torch.dtype | None = None) -> None:
        self.name, self.device, self.tags, self.local, self.shape = name, device, tags, local, shape
        self.dtype = dtype


def line_names(depth: int, tags: Callable[[Any], tuple[tuple[str, ...], bool]]) -> tuple[Named, ...]:
    """The tensors the innermost frame of the program's own files reads by a plain name at its current line (asked
    at a failing op only); empty when that line does not parse alone."""
    from torchdoctor._virtual.moveby import is_own
    from torchdoctor._virtual.origin import MACHINERY

    try:
        f: Any = sys._getframe(depth)
        while f is not None and (f.f_code.co_filename.startswith(MACHINERY) or not is_own(f.f_code.co_filename)):
            f = f.f_back
        if f is None:
            return ()
        body = linecache.getline(f.f_code.co_filename, f.f_lineno).strip().rstrip(":")
        try:
            tree = ast.parse(body)
        except SyntaxError:
            return ()
        code = f.f_code
        mine = set(code.co_varnames) | set(code.co_cellvars)
        top = code.co_name == "<module>"
        out: list[Named] = []
        seen: set[str] = set()
        for n in ast.walk(tree):
            if not isinstance(n, ast.Name) or not isinstance(n.ctx, ast.Load) or n.id in seen:
                continue
            seen.add(n.id)
            v = f.f_locals.get(n.id)
            if isinstance(v, torch.Tensor):
                out.append(Named(n.id, getattr(v, "_td_device", v.device), (*tags(v)[0], *_real_maker(v)),
                                 top or n.id in mine, tuple(v.shape), v.dtype))
        return tuple(out)
    except Exception:  # a diagnostic never breaks the program it watches
        return ()


def _real_maker(t: torch.Tensor) -> tuple[str, ...]:
    """A real (cpu) tensor's maker kept by the run (``torch.from_numpy`` at the program's line), as its virtual
    stand-in at an op is tagged; empty for a virtual tensor or none kept."""
    from torchdoctor._virtual.tensor import current_space

    space = current_space()
    if hasattr(t, "_td_device") or space is None or not space.real:
        return ()
    kept = space.real_record(t)
    src = getattr(kept[1], "source", None) if kept is not None else None
    if src is None or not str(src.op).startswith("torch.") or src.paths or src.module is not None:
        return ()
    return (f"factory {src.op}" + (f" at {src.at}" if src.at else ""),)
