"""A name kept for a tensor before the code moved it (TransformerLens' ``generate``: ``input_tokens = inp`` then
``inp = inp.to(device)``; ``torch.cat([input_tokens] + out)`` at the end): ``Tensor.to`` makes a new tensor, so the
old name still holds the one on the cpu. The caller passing its tensor on the device hides the bug for every other
caller; the fix is where the stale name is used (``input_tokens.to(inp.device)``), a diff of that line, with the
line that bound it named. Found from the program's source: the failing op's line, the function around it, a plain
``a = b`` before a ``b = b.to(...)`` (or ``.cuda()``), and ``a`` read at the failing line.
"""

from __future__ import annotations

import ast
import builtins
import linecache
from collections.abc import Sequence
from typing import Any

from torchdoctor._virtual.prove import Fix

_MOVES = ("to", "cuda", "xpu", "mps")


def stale_fix(key: str, cases: Sequence[Any], target: Any) -> Fix | None:
    """The fix at the failing op's line where an operand made by ``key`` (``factory torch.tensor at app.py:17``) is
    read under a name bound before the function moved the tensor it named; None when there is none."""
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._virtual.feeder import operands

    met = False  # a failing op before this one read the maker's tensor: it is right for no earlier use
    for c in cases:
        if c.line is None or not any(key in o.tags for o in operands(c.before)):
            continue
        met, before = True, met
        file, line = c.line
        if not own_file(file):
            continue
        hit = _stale(file, line)
        if hit is not None:
            return _fix(key, file, line, c.at, target, *hit)
        used = _used_before(key, file, line) if not before else None
        if used is not None:
            return _at_use(key, file, line, c.at, target, *used)
    return None


def _used_before(key: str, file: str, line: int) -> tuple[str, int, int] | None:
    """(the name, the maker's line, the line that read it before) where ``key``'s factory (``factory torch.randn at
    app.py:5``) bound a name in ``file`` that a call read between that line and the failing ``line`` (a model ran
    on it there before it moved), and nothing bound it again: the maker's tensor is right for that use, so it is moved at ``line``."""
    from torchdoctor._virtual.origin import LINES

    made_file, made = LINES.get(key.rpartition(" at ")[2], ("", 0))
    if made_file != file or not 0 < made < line:
        return None
    try:
        tree = ast.parse("".join(linecache.getlines(file)))
    except (SyntaxError, ValueError):
        return None
    scope = min((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and
                 n.lineno <= line <= (n.end_lineno or 0)), key=lambda n: (n.end_lineno or 0) - n.lineno, default=tree)
    bound = next((n.targets[0].id for n in ast.walk(scope) if isinstance(n, ast.Assign) and n.lineno == made and
                  len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)), None)
    if bound is None:
        return None
    loads = [n.lineno for n in ast.walk(scope) if isinstance(n, ast.Name) and n.id == bound and
             isinstance(n.ctx, ast.Load)]
    again = [n.lineno for n in ast.walk(scope) if isinstance(n, ast.Name) and n.id == bound and
             isinstance(n.ctx, ast.Store) and made < n.lineno <= line]
    calls = {a.lineno for n in ast.walk(scope) if isinstance(n, ast.Call) and not (isinstance(n.func, ast.Name) and
             n.func.id in dir(builtins)) for a in (*n.args, *(k.value for k in n.keywords))
             if isinstance(a, ast.Name) and a.id == bound}  # handed as it is to a call that computes (never print)
    before = sorted(n for n in loads if made < n < line and n in calls)
    if again or not before or line not in loads:
        return None
    return bound, made, before[0]


def _at_use(key: str, file: str, line: int, at: str | None, target: Any, name: str, made: int,
            used: int) -> Fix | None:
    import re

    from torchdoctor._report.diff import line_patch

    raw = linecache.getline(file, line).rstrip("\r\n")
    new = re.sub(rf"(?<![\w.]){re.escape(name)}\b(?!\s*=[^=])", f"{name}.to({str(target)!r})", raw, count=1)
    if new == raw:
        return None
    short = file.replace("\\", "/").rsplit("/", 1)[-1]
    return Fix(f"{new.strip()}  # {short}:{made} makes {name} where {short}:{used} uses it as it is; "
               f"{at or f'{short}:{line}'} hands it to code on {target}: moved there, at that use (a device= at its "
               "maker would break the earlier use)", "note", target, sets=((key, target),),
               diff=line_patch(file, line, new.strip()))


def _stale(file: str, line: int) -> tuple[str, str, int, int] | None:
    """(the stale name, the name it copied, the line binding it, the line moving the other) at ``line``."""
    try:
        tree = ast.parse("".join(linecache.getlines(file)))
    except (SyntaxError, ValueError):
        return None
    fn = min((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and
              n.lineno <= line <= (n.end_lineno or 0)), key=lambda n: (n.end_lineno or 0) - n.lineno, default=None)
    if fn is None:
        return None
    read = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.lineno == line}
    binds: list[tuple[int, str, ast.expr]] = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and \
                node.lineno < line:
            binds.append((node.lineno, node.targets[0].id, node.value))
    binds.sort(key=lambda b: b[0])
    for at, name, value in binds:
        if isinstance(value, ast.IfExp):  # ``a = b if isinstance(b, torch.Tensor) else None``: b when it holds one
            value = value.body if isinstance(value.body, ast.Name) else value.orelse
        if name not in read or not isinstance(value, ast.Name):
            continue
        other = value.id
        if any(n == name and a > at for a, n, _ in binds):
            continue  # bound again before the failing line: not stale
        moved = next((a for a, n, v in binds if n == other and a > at and _moves(v, other)), None)
        if moved is not None:
            return name, other, at, moved
    return None


def _moves(value: ast.expr, name: str) -> bool:
    """``name.to(...)`` / ``name.cuda()``: a move of the tensor ``name`` holds, giving a new one."""
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _MOVES and \
        isinstance(value.func.value, ast.Name) and value.func.value.id == name


def _fix(key: str, file: str, line: int, at: str | None, target: Any, name: str, other: str, bound: int,
         moved: int) -> Fix | None:
    import re

    from torchdoctor._report.diff import line_patch

    raw = linecache.getline(file, line).rstrip("\r\n")
    new = re.sub(rf"(?<![\w.]){re.escape(name)}\b(?!\s*=[^=])", f"{name}.to({other}.device)", raw)
    diff = line_patch(file, line, new.strip()) if new != raw else None
    short = file.replace("\\", "/").rsplit("/", 1)[-1]
    where = at or f"{short}:{line}"
    return Fix(f"# {short}:{bound} binds {name} to {other} before {short}:{moved} moves {other} (Tensor.to gives a new "
               f"tensor: {name} still holds the one it was given), and {where} reads it: use it where it was moved "
               f"({name}.to({other}.device)), or bind {name} after the move; passing it on the device from the "
               "caller hides this for every other caller", "note", target, sets=((key, target),), diff=diff)
