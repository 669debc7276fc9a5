"""A move at a line of the user's own code that sends a tensor to a fixed device (``timestep = timestep.cuda()``:
the current device, cuda:0, on a cuda:1 run) fixed at that line: moved to the device of the tensor it meets at the
failing op (``timestep.to(self.timesteps.device)``), as a diff of that file. The other operand is read from the
failing op's line (``self.timesteps - timestep``), in the same function; where it cannot be read the fix stays the
note it was.
"""

from __future__ import annotations

import ast
import re
from typing import Any

_MOVES = ("cuda", "to", "xpu", "mps", "cpu")


def _line(file: str, lineno: int) -> str | None:
    try:
        with open(file, encoding="utf-8") as fh:
            return fh.read().split("\n")[lineno - 1].rstrip("\r")
    except (OSError, IndexError, UnicodeDecodeError):
        return None


def _one(body: str) -> ast.stmt | None:
    try:
        tree = ast.parse(body)
    except (SyntaxError, ValueError):
        return None
    return tree.body[0] if len(tree.body) == 1 else None


def _same_function(file: str, a: int, b: int) -> bool:
    """Lines ``a`` and ``b`` of ``file`` are in one function (a name read at ``b`` means the same at ``a``)."""
    try:
        with open(file, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return False
    def innermost(x: int) -> Any:
        hits = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                and n.lineno <= x <= (n.end_lineno or 0)]
        return max(hits, key=lambda n: n.lineno) if hits else None

    return innermost(a) is not None and innermost(a) is innermost(b)


def other_operand(var: str, body: str) -> str | None:
    """The expression ``var`` meets in a binary op or comparison on a line (``self.timesteps`` in
    ``(self.timesteps - timestep).abs()``), or None (none, or more than one)."""
    stmt = _one(body)
    if stmt is None:
        return None
    found: set[str] = set()
    for n in ast.walk(stmt):
        sides: list[ast.expr] = [n.left, n.right] if isinstance(n, ast.BinOp) else \
            [n.left, *n.comparators] if isinstance(n, ast.Compare) else []
        names = [ast.unparse(s) for s in sides]
        if var in names:
            found.update(x for x, s in zip(names, sides) if x != var and not isinstance(s, ast.Constant))
    return found.pop() if len(found) == 1 else None


def moved_line_fix(moved_at: str, op_at: str | None, op_line: tuple[str, int] | None, found: str,
                   want: str | None = None) -> tuple[str, str, str] | None:
    """(code, diff, the move's method name) of the move at ``moved_at`` ("file:line") sent to the device of what it
    meets at the failing op's line ``op_at`` (``op_line``: its file and line), read there when it is a name or an
    attribute of one function (``self.timesteps``); else to the device of a tensor argument of the move's own
    function that was on ``want`` (the failing op's device) when the move ran (``x`` in ``forward(self, x)``), never
    to a call written again (``self.lin(x)`` would run the layer twice). None when the move's line is not one simple
    assignment, or no such tensor can be named."""
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.moveby import ARGS, DEVARGS
    from torchdoctor._virtual.origin import LINES

    file, line = LINES.get(moved_at, ("", 0))
    if not file or not own_file(file):
        return None
    raw = _line(file, line)
    if raw is None or not raw.isascii():
        return None
    body = raw.lstrip(" \t")
    stmt = _one(body)
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1 or \
            not isinstance(stmt.targets[0], (ast.Name, ast.Attribute, ast.Subscript)):  # ``x = ...``,
        # ``self.sigmas = ...`` or a cache's entry (``grid_cache[k] = torch.cat(...).to(device)``)
        return None
    var = ast.unparse(stmt.targets[0])
    calls = [n for n in ast.walk(stmt.value) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr in _MOVES]
    if len(calls) != 1 or calls[0].end_col_offset is None:
        return None
    ofile, oline = op_line or ("", 0)
    other_raw = _line(file, oline) if file == ofile and oline != line and _same_function(file, line, oline) else None
    other = other_operand(var, other_raw.strip()) if other_raw is not None else None
    if other is not None and any(isinstance(n, ast.Call) for n in ast.walk(ast.parse(other, mode="eval"))):
        other = None  # a call: written again it would compute again
    read = other is not None
    if other is None:
        other = next((n for n, d in ARGS.get(moved_at, ()) if want is not None and d == want), None)
    to = f"{other}.device"
    if other is None:  # the function's own device argument, given the device the failing op runs on
        other = next((n for n, d in DEVARGS.get(moved_at, ()) if want is not None and d == want), None)
        to = other or ""
    if other is None:
        return None
    call, pad, end = calls[0], len(raw) - len(body), calls[0].end_col_offset or 0
    func: Any = call.func
    receiver = ast.get_source_segment(body, func.value)
    if receiver is None:
        return None
    new = raw[:pad + call.col_offset] + f"{receiver}.to({to})" + raw[pad + end:]
    diff = line_patch(file, line, new)
    if diff is None:
        return None
    said = ast.get_source_segment(body, call) or "the move"
    code = body[:call.col_offset] + f"{receiver}.to({to})" + body[end:stmt.end_col_offset or 0]
    meets = f"the device of {other}, which it meets at {op_at}" if read else \
        f"the device of {other} ({want}, where it meets the tensors of {op_at})" if to != other else \
        f"its function's `{other}` argument ({want}, where it meets the tensors of {op_at})"
    pick = _module_pick(file, call)
    return f"# {moved_at}: {said} sends it to {found}, not to {meets}{pick}: {code}", diff, func.attr


def _module_pick(file: str, call: ast.Call) -> str:
    """`` (`device` is picked once at module level, warplayer.py:4: `device = ...`)`` when the move's device is a
    name the file assigns at its top level (RIFE's ``device = torch.device("cuda" if torch.cuda.is_available() else
    "cpu")``: the cpu on a Mac or an Intel GPU), else ""."""
    import os

    from torchdoctor._virtual.ownline import source

    arg = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "device"), None)
    got = source(file) if isinstance(arg, ast.Name) else None
    if got is None or not isinstance(arg, ast.Name):
        return ""
    for stmt in got[0].body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == arg.id for t in stmt.targets):
            text = (ast.get_source_segment(got[1], stmt) or "").split("\n", 1)[0]
            return f" (`{arg.id}` is picked once at module level, {os.path.basename(file)}:{stmt.lineno}: `{text}`)"
    return ""


def numpy_fix(at: str, found: str, before: str = ".cpu()") -> tuple[str, str] | None:
    """(code, diff) of a ``.numpy()`` of a device tensor at ``at`` ("file:line" of the user's code): read as
    ``x.cpu().numpy()`` there (``before``: what goes before ``.numpy()``, ``.detach().cpu()`` for a tensor that requires
    grad); None when the line does not hold one such call."""
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.origin import LINES

    file, line = LINES.get(at, ("", 0))
    raw = _line(file, line) if file and own_file(file) else None
    if raw is None or not raw.isascii():
        return None
    body = raw.lstrip(" \t")
    stmt = _one(body)
    calls = [n for n in ast.walk(stmt) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "numpy" and not n.args] if stmt is not None else []
    if not calls and stmt is not None:  # ``np.asarray(waveform)``, as soundfile and PIL read a tensor: its argument
        return _array_fix(at, found, before, file, line, raw, body, stmt)
    if len(calls) != 1:
        return None
    func: Any = calls[0].func
    recv = ast.get_source_segment(body, func.value)
    if recv is None or recv.endswith(".cpu()") or func.value.end_col_offset is None:
        return None
    cut = len(raw) - len(body) + func.value.end_col_offset
    new = raw[:cut] + before + raw[cut:]
    diff = line_patch(file, line, new)
    if diff is None:
        return None
    return (f"# {at}: {recv}.numpy() reads a tensor on {found}; numpy reads host memory: {recv}{before}.numpy()", diff)


def _array_fix(at: str, found: str, before: str, file: str, line: int, raw: str, body: str,
               stmt: Any) -> tuple[str, str] | None:
    """(code, diff) of ``np.asarray(x)`` / ``np.array(x)`` of a device tensor at ``at``: ``np.asarray(x.cpu())``;
    None when the line holds no one such call of a plain name or attribute."""
    from torchdoctor._report.diff import line_patch

    calls = [n for n in ast.walk(stmt) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and isinstance(n.func.value, ast.Name) and n.func.value.id in ("np", "numpy") and n.args and
             isinstance(n.args[0], (ast.Name, ast.Attribute, ast.List, ast.Tuple))]
    if len(calls) != 1 or calls[0].args[0].end_col_offset is None:
        return None
    arg = calls[0].args[0]
    recv = ast.get_source_segment(body, arg)
    if recv is None:
        return None
    if isinstance(arg, (ast.List, ast.Tuple)):  # ``np.array([x, y])``: each tensor it lists
        if not arg.elts or not all(isinstance(e, (ast.Name, ast.Attribute)) for e in arg.elts):
            return None
        moved = recv[0] + ", ".join(f"{ast.unparse(e)}{before}" for e in arg.elts) + recv[-1]
    elif isinstance(arg, ast.Name) and _listed(file, line, arg.id):  # ``np.sum(losses)`` of a list it appends to
        moved = f"[t{before} for t in {recv}]"
    else:
        moved = recv + before
    start, cut = len(raw) - len(body) + arg.col_offset, len(raw) - len(body) + int(arg.end_col_offset or 0)
    diff = line_patch(file, line, raw[:start] + moved + raw[cut:])
    if diff is None:
        return None
    call = ast.unparse(calls[0].func)
    return (f"# {at}: {call}({recv}) reads a tensor on {found}; numpy reads host memory: {call}({moved})", diff)


def _listed(file: str, line: int, name: str) -> bool:
    """``name`` is a list in the function holding ``line`` (``losses = []`` then ``losses.append(...)``)."""
    from torchdoctor._virtual.devexpr import enclosing

    scope = enclosing(file, line)
    for n in ast.walk(scope) if scope is not None else ():
        if isinstance(n, ast.Assign) and isinstance(n.value, (ast.List, ast.ListComp)) and any(
                isinstance(t, ast.Name) and t.id == name or isinstance(t, ast.Tuple) and any(
                    isinstance(e, ast.Name) and e.id == name for e in t.elts) for t in n.targets):
            return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("append", "extend") \
                and isinstance(n.func.value, ast.Name) and n.func.value.id == name:
            return True
    return False


_TAKEN = re.compile(r"\(taken to (\S+) by `([^`]+)` at \S+(?:, held as ([^)]+))?\)")


def taken_back(fixes: list[Any], p: Any, name: str, at: str, key: str, target: Any) -> bool:
    """A copy of a model tensor the program's own line took to another device (``master = {n: p.detach().cpu()
    ...}``) and handed to a module that runs on ``target`` (``functional_call(model, master, ...)``): one fix per
    line, naming every tensor it took and how the program holds them; False when ``p`` is no such copy."""
    from torchdoctor._virtual.prove import Fix

    m = _TAKEN.search(p.message)
    if m is None:
        return False
    went, call, held = m.groups()
    if not held:  # the model holds the copy again (``net.table = net.table.cpu()``): put back, by its path
        from torchdoctor._guard.maps import code_path

        c = code_path(name)
        fixes.append(Fix(f"# {at} takes {name} to {went} with `{call}` and the model holds that copy: keep it on "
                         f"{p.expected} (drop `{call}`), or put it back before the forward: {c} = "
                         f"{c}.to({p.expected!r})", "note", target, sets=((key, target),)))
        return True
    head = f"# {at} takes copies of "
    mine = next((f for f in fixes if f.code.startswith(head) and f.kind == "note"), None)  # that line's fix so far
    was_names, _, was_held = mine.label.partition(";") if mine is not None else ("", "", "")
    if name in was_names.split(", "):
        return True
    names = [*(was_names.split(", ") if was_names else []), name]
    helds = [*(was_held.split(", ") if was_held else []), *([held] if held else [])]
    holder = helds[0].split("[", 1)[0] if helds else None
    shown = f" (held as {', '.join(helds[:3])}{', ...' if len(helds) > 3 else ''})" if helds else ""
    back = f"{{k: v.to(x.device) for k, v in {holder}.items()}}" if holder else ".to(x.device)"
    code = (f"{head}{', '.join(names)} to {went}{shown} and they are handed to a module on {p.expected}: keep them "
            f"where the model is (drop `{call}`), or move them back where they are passed ({back})")
    sets = (*(mine.sets if mine is not None else ()), (key, target))
    fix = Fix(code, "note", target, f"{', '.join(names)};{', '.join(helds)}", sets=sets)  # (the next copy joins)
    if mine is not None:
        fixes[fixes.index(mine)] = fix
    else:
        fixes.append(fix)
    return True
