"""The program's line where the model's data was promoted by a tensor a cast made wider on purpose: a rope that
computes its angles in float32 (``pos.to(fdtype)``) and applies them to float16 q/k (``x1 * cos - x2 * sin``)
returns float32 q/k, which then meet float16 v in attention. Casting the positions to float16 fixes nothing (the
float32 frequencies promote them back) and loses precision; the fix is that line's value cast back to the dtype of
the data it promoted (``return (...).to(x.dtype)``), where the promoted tensor returns into the model's flow.

``widened_at`` records such a line during a virtual run (``origin.made_from``: an op in a module whose result takes
its dtype from a made tensor whose chain starts at a cast, and whose other floating operand is narrower); the chain
starts there (``Made.source``), so the problem's source is ``widened at file:line`` and its fix is ``widened_fix``,
proven at the failing op with the operand cast back."""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from torchdoctor._placement import dtype_str

__all__ = ["KEY", "Widened", "widened_at", "widened_fix"]

KEY = "widened at "  # a source's name: the line, as reports write it
SEEN: dict[str, Widened] = {}  # "file:line" -> what was promoted there (bounded)


@dataclass(frozen=True)
class Widened:
    at: str  # the line, "file:line"
    name: str  # the program's name at that line for the data promoted (a tensor argument of its function), or ""
    low: str  # the data's dtype
    high: str  # what it became
    cast: str  # the cast that made the wider tensor, "file:line"; "" when the run did not make it (made before)
    wide: str = ""  # the program's name at that line for the wider tensor, where the run did not make it

    def describe(self, m: Any, link: str) -> str:
        who = f"{self.name} ({self.low})" if self.name else f"{self.low} data"
        return f"{m.op} at {self.at}, where {who} meets a {self.high} tensor" + (f" made by {link}" if link else "")


def widened_at(cast: torch.Tensor, dtype: torch.dtype, site: Any, frame: Any, short_at: Callable[[Any], str],
               lines: dict[str, tuple[str, int]]) -> Widened | None:
    """The record of the line running in ``frame`` (the program's own file) where ``cast`` (narrower than ``dtype``)
    was promoted by a tensor whose chain starts at the cast ``site``; None when it is no such line."""
    from torchdoctor._guard.ownfile import own_file

    if frame is None or not cast.dtype.is_floating_point or cast.dtype == dtype or \
            torch.promote_types(cast.dtype, dtype) != dtype or not own_file(frame.f_code.co_filename):
        return None
    at = short_at(frame)
    if at in SEEN:
        return SEEN[at]
    code, loc = frame.f_code, frame.f_locals
    args = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    name = next((n for n in args if n != "self" and isinstance(loc.get(n), torch.Tensor)
                 and loc[n].dtype == cast.dtype), next((n for n, v in loc.items() if v is cast), "")) or \
        _own_tensor(loc.get("self"), cast.dtype, frame)  # ``self.weight * x``: the module's own weight's dtype
    lines[at] = (code.co_filename, frame.f_lineno)
    made = getattr(site, "at", "") or ""
    w = Widened(at, name, dtype_str(cast.dtype), dtype_str(dtype), made, "" if made else _wide_name(frame, dtype))
    if len(SEEN) < 1024:
        SEEN[at] = w
    return w


def _own_tensor(me: Any, dtype: torch.dtype, frame: Any) -> str:
    """``self.weight``: a parameter or buffer of the module running (``me``) in ``dtype`` that the line reads, or
    "" (a fix reads the model's dtype from it: ``.to(self.weight.dtype)`` holds in any dtype the model is cast to)."""
    import linecache
    import re

    if not isinstance(me, torch.nn.Module):
        return ""
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    own = [*me.named_parameters(recurse=False), *me.named_buffers(recurse=False)]
    return next((f"self.{n}" for n, v in own if v.dtype == dtype and re.search(rf"\bself\.{re.escape(n)}\b", line)),
                "")


def _wide_name(frame: Any, dtype: torch.dtype) -> str:
    """The name the line running in ``frame`` reads a ``dtype`` tensor by (a local or a module global: ``K``), or
    ""."""
    import linecache
    import re

    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    for scope in (frame.f_locals, frame.f_globals):
        for n, v in scope.items():
            if isinstance(v, torch.Tensor) and v.dtype == dtype and re.search(rf"(?<![\w.]){re.escape(n)}\b", line):
                return n
    return ""


def widened_fix(key: str, target: Any, lines: dict[str, tuple[str, int]]) -> Any:
    """The fix of a problem whose source is ``widened at file:line``: that line's value cast back to the dtype of the
    data it promoted, as a diff where the line is one statement; None when ``target`` is not that dtype."""
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.ownline import own_line
    from torchdoctor._virtual.prove import Fix

    w = SEEN.get(key[len(KEY):])
    if w is None or not isinstance(target, torch.dtype) or dtype_str(target) != w.low:
        return None
    file, line = lines.get(w.at, ("", 0))
    got = own_line(file, line)
    want = f"{w.name}.dtype" if w.name else f"torch.{w.low}"
    new = None
    if got is not None:
        raw, body, tree = got
        stmt = tree.body[0] if len(tree.body) == 1 else None
        value = stmt.value if isinstance(stmt, (ast.Return, ast.Assign, ast.AnnAssign)) else None
        if value is not None and value.end_col_offset is not None and (value.end_lineno or 1) == 1:
            pad, text = len(raw) - len(body), ast.get_source_segment(body, value) or ""
            atom = isinstance(value, (ast.Call, ast.Name, ast.Attribute, ast.Subscript))
            new = raw[:pad + value.col_offset] + (text if atom else f"({text})") + f".to({want})" + \
                raw[pad + value.end_col_offset:]
    said = f"# {w.at}: " + (f"`{got[1].strip()}` " if got is not None else "") + \
        f"promotes {w.name or 'the model data'} ({w.low}) to {w.high} with " + (
            f"a tensor the cast at {w.cast} made {w.high}" if w.cast else
            f"{w.wide or 'a tensor'} ({w.high}, made before the run)") + \
        f": cast the line's value back to {want} there" + (f": {new.strip()}" if new else "")
    diff = line_patch(file, line, new) if new else None
    return Fix(said, "note", target, sets=((key, target),), diff=diff,
               rewiden=(file, line, target) if diff is not None else None)
