"""Where a host cast's dtype was written: ``lin.weight.data = lin.weight.data.to(weight_dtype)`` inside a loader
called as ``load_diffusion_model(weight_dtype)``, with ``weight_dtype = torch.float8_e4m3fn`` at the top of the
program. A device that cannot hold that dtype (float8 on MPS) refuses the model's move later; the fix is at the line
that chose the dtype (``weight_dtype = torch.float16``, a diff), not a cast of "a tensor made outside the model".

The name is followed while the frames are alive (at the cast): a parameter of the running function is followed to
the argument its caller's line passed, a name bound in a frame to its one-line assignment before that frame's line.
Only the program's own files are read (``ownline``); anything else leaves the cast's own line as the fix's place.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

import torch

_DEPTH = 8  # callers followed at most
SAID: dict[str, Any] = {}  # "file:line" of a cast a refused move's problem named -> its record (this run's)


@dataclass(frozen=True)
class HostCast:
    """The program's cast of a host tensor to ``dtype`` at ``at`` (``text``, the line), and the line that bound the
    dtype it read (``bound_at``, ``bound``: that line's code, ``value``: the expression the fix replaces)."""

    at: str
    file: str
    line: int
    text: str
    dtype: torch.dtype
    bound_at: str | None = None
    bound_file: str = ""
    bound_line: int = 0
    bound: str = ""

    def said(self) -> str:
        """`` (cast to float8_e4m3fn by `lin.weight.data.to(weight_dtype)` at app.py:13, the dtype from
        `weight_dtype = torch.float8_e4m3fn` at app.py:17)``."""
        from torchdoctor._placement import dtype_str

        src = f", the dtype from `{self.bound}` at {self.bound_at}" if self.bound_at else ""
        return f" (cast to {dtype_str(self.dtype)} by `{self.text}` at {self.at}{src})"


_TO = re.compile(r"\.to\(\s*(?:dtype\s*=\s*)?([A-Za-z_][\w.]*)\s*\)")


def host_cast(dtype: torch.dtype) -> HostCast | None:
    """The cast running now at the program's line (its frame alive), with its dtype's binding; None outside the
    program's own code."""
    from torchdoctor._virtual.origin import short_at, user_frame
    from torchdoctor._virtual.ownline import own_line

    f = user_frame(3)
    if f is None:
        return None
    key = (f.f_code, f.f_lineno, dtype)
    known = _KNOWN.get(key, _UNREAD)
    if known is not _UNREAD:  # the same line again (a loop): read once
        return known  # type: ignore[return-value]
    read = own_line(f.f_code.co_filename, f.f_lineno)
    rec = _read(f, short_at(f), read[1], dtype) if read is not None else None
    if len(_KNOWN) >= 512:
        _KNOWN.pop(next(iter(_KNOWN)))
    _KNOWN[key] = rec
    return rec


_UNREAD = object()
_KNOWN: dict[tuple[Any, int, torch.dtype], HostCast | None] = {}  # (code, line, dtype) -> its record, once a run


def _read(f: Any, at: str, body: str, dtype: torch.dtype) -> HostCast | None:
    m = _TO.search(body)
    bound = _bound(f, m.group(1)) if m is not None and "." not in m.group(1) else None
    if bound is None:
        return HostCast(at, f.f_code.co_filename, f.f_lineno, body, dtype)
    file, line, text = bound
    return HostCast(at, f.f_code.co_filename, f.f_lineno, body, dtype, _short(file, line), file, line, text)


def _short(file: str, line: int) -> str:
    import os

    cwd = os.getcwd() + os.sep
    return f"{file[len(cwd):] if file.startswith(cwd) else os.sep.join(file.split(os.sep)[-2:])}:{line}"


def _bound(frame: Any, name: str) -> tuple[str, int, str] | None:
    """(file, line, code) of the line that bound ``name`` as ``frame`` reads it: through the parameters of the
    functions on the way (the argument each caller's line passed), to a one-line assignment."""
    from torchdoctor._virtual.ownline import own_line

    for _ in range(_DEPTH):
        code = frame.f_code
        params = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        if name not in params:
            return _assigned(frame, name)
        caller = frame.f_back
        read = own_line(caller.f_code.co_filename, caller.f_lineno) if caller is not None else None
        if read is None:
            return None
        arg = _argument(read[2], code.co_name, params, name)
        if arg is None:
            return None
        if not isinstance(arg, ast.Name):  # written in the call itself (``load(torch.float8_e4m3fn)``)
            return caller.f_code.co_filename, caller.f_lineno, ast.unparse(read[2])
        frame, name = caller, arg.id
    return None


def _argument(tree: ast.Module, function: str, params: tuple[str, ...], name: str) -> ast.expr | None:
    """The expression a call of ``function`` on the caller's line passes for parameter ``name``."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and (
        isinstance(n.func, ast.Name) and n.func.id == function or
        isinstance(n.func, ast.Attribute) and n.func.attr == function)]
    if len(calls) != 1:
        return None
    call = calls[0]
    hit = next((k.value for k in call.keywords if k.arg == name), None)
    if hit is not None:
        return hit
    index = params.index(name) - (1 if params and params[0] in ("self", "cls") and
                                  isinstance(call.func, ast.Attribute) else 0)
    if any(isinstance(a, ast.Starred) for a in call.args[:index + 1]) or not 0 <= index < len(call.args):
        return None
    return call.args[index]


def _assigned(frame: Any, name: str) -> tuple[str, int, str] | None:
    """The last one-line ``name = ...`` of ``frame``'s own code (its function, or the module) before its line."""
    from torchdoctor._virtual.ownline import own_line

    file, now = frame.f_code.co_filename, frame.f_lineno
    tree = _parsed(file)
    if tree is None:
        return None
    scope: Any = tree
    if frame.f_code.co_name != "<module>":
        scope = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and
                      n.name == frame.f_code.co_name and n.lineno <= now <= (n.end_lineno or 0)), None)
        if scope is None:
            return None
    hits = [n for n in _own_statements(scope) if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.lineno < now and
            n.lineno == n.end_lineno and any(isinstance(t, ast.Name) and t.id == name for t in (
                n.targets if isinstance(n, ast.Assign) else [n.target]))]
    if not hits:
        return None
    return file, hits[-1].lineno, ast.unparse(hits[-1])  # the code as said, its comment left out


def _own_statements(scope: Any) -> list[ast.stmt]:
    """The statements of a module or function, its nested functions' and classes' left out."""
    out: list[ast.stmt] = []
    todo = list(getattr(scope, "body", []))
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        out.append(node)
        for field in ("body", "orelse", "finalbody", "handlers"):
            todo.extend(x for x in getattr(node, field, []) if isinstance(x, ast.AST))
    return out


def _parsed(file: str) -> ast.Module | None:
    from torchdoctor._guard.ownfile import own_file

    if not own_file(file):
        return None
    try:
        with open(file, encoding="utf-8") as fh:
            return ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None


def named(rec: HostCast) -> str:
    """What a refused move's message adds for the tensor ``rec`` made (its record kept for the fix)."""
    if len(SAID) < 512:
        SAID[rec.at] = rec
    return rec.said()


def fix(rec: HostCast, what: str, found: str, want: torch.dtype, device: str) -> Any:
    """The fix of a refused move of what ``rec`` cast: the binding line's value written ``want`` (a diff), else the
    cast's own line casting to ``want``; judged as a factory's dtype is (the device holds ``want``). None when
    neither line can be rewritten."""
    from torchdoctor._placement import dtype_str
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.ownline import own_line
    from torchdoctor._virtual.prove import Fix

    new = None
    if rec.bound_at:
        read = own_line(rec.bound_file, rec.bound_line)
        stmt = read[2].body[0] if read is not None and len(read[2].body) == 1 else None
        value = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
        if read is not None and value is not None and value.end_col_offset is not None and read[0].isascii():
            pad = len(read[0]) - len(read[1])
            new = read[0][:pad + value.col_offset] + f"torch.{dtype_str(want)}" + read[0][pad + value.end_col_offset:]
            where, line, file = rec.bound_at, rec.bound_line, rec.bound_file
    if new is None:
        from torchdoctor._virtual.castsites import CastSite, patched_line

        new = patched_line(CastSite(rec.at, rec.file, rec.line, rec.text, rec.text, rec.dtype), want)
        where, line, file = rec.at, rec.line, rec.file
    diff = line_patch(file, line, new.strip()) if new is not None else None
    if diff is None or new is None:
        return None
    code = new.strip()
    try:  # the line as code, its own comment left out (the diff keeps it)
        code = ast.unparse(ast.parse(code))
    except SyntaxError:
        pass
    return Fix(f"{code}  # {where}: {what} is cast to {found} at {rec.at}, and {device} cannot hold {found} "
               f"(its move raises): make it {dtype_str(want)}, which {device} holds",
               "factory", want, sets=((f"cast at {rec.at}", want),), diff=diff)


__all__ = ["SAID", "HostCast", "fix", "host_cast", "named"]
