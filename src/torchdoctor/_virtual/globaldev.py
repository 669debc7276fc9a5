"""A component the program moves itself to a device it picked once, at module level (a ComfyUI node's
``device = "cuda" if torch.cuda.is_available() else "cpu"``: on an XPU or a Mac that is the cpu), while the rest of
the run is on the accelerator: a move of its tensors is undone by that line and the inputs it is given are moved
there too, so the fix is where the device is picked (a diff: the accelerator torch finds, any kind), proven by a
re-run with that module-level name set to the run's device."""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from torchdoctor._virtual.ownline import source
from torchdoctor._virtual.prove import Fix

__all__ = ["device_line_fix", "reglobals"]

_PICK = 'torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"'


_Move = tuple[Any, torch.device, str, int, str, dict[str, Any]]  # a module, its device, file, line, at, globals


def device_line_fix(f: Fix, moves: Sequence[_Move], root: Any) -> Fix | None:
    """``f`` (moves of tensors to the run's device) replaced by the device pick the program moved their module with
    — module-level, or local to the function that moves it — fixed (a diff); None when the tensors' module was not
    moved by such a name."""
    from torchdoctor._report.diff import line_patch

    if f.kind != "path" or not f.sets or not moves or not isinstance(root, torch.nn.Module):
        return None
    targets = {t for _, t in f.sets}
    if len(targets) != 1 or not isinstance(want := next(iter(targets)), torch.device) or want.type == "cpu":
        return None
    found_by = [_moved_by(path, moves, root) for path, _ in f.sets]
    hits = [h[1] if h is not None else None for h in found_by]
    hit = hits[0]
    if hit is None or any(h is None or h[:4] != hit[:4] for h in hits):
        return None
    was, file, line, at, names = hit
    comps = {h[0] for h in found_by if h is not None}
    if was.type == want.type:
        return None
    found = _global_pick(file, line)
    if found is None:
        return None
    name, def_line, raw, value, uses, func = found
    if func is None and name not in names:
        return None
    new = raw[:value[0]] + _PICK + raw[value[1]:]
    diff = line_patch(file, def_line, new.strip())
    if diff is None:
        return None
    short = at.rsplit(":", 1)[0]
    when = "it is read when the module is imported" if func is None else f"it is picked each time {func}() runs"
    return Fix(f"# {at} moves its component to {name} = {raw[value[0]:value[1]]} ({short}:{def_line}), which is "
               f"{was.type} here while the run is on {want}: pick the device torch finds, any kind "
               f"({name} = {_PICK}; {when})", "note", want, diff=diff,
               reglobal=(names, name, want.type) if func is None else None, sets=(*((c + "." if c else "*", want) for c in sorted(comps)), *(
                   (f"moved a tensor at {short}:{n}", want) for n in uses)))  # what it moves there, judged at the op


def _moved_by(path: str, moves: Sequence[_Move], root: torch.nn.Module
              ) -> tuple[str, tuple[torch.device, str, int, str, dict[str, Any]]] | None:
    """The program's last move of the module holding ``path`` (or of a module above it, the model itself too:
    ``net = nn.Sequential(...).to(device)``)."""
    parts = path.split(".")
    for i in range(len(parts) - 1, -1, -1):
        try:
            mod = root.get_submodule(".".join(parts[:i]))
        except AttributeError:
            continue
        hit = next((m[1:] for m in reversed(moves) if m[0]() is mod), None)
        if hit is not None:
            return ".".join(parts[:i]), hit
    return None


def _global_pick(file: str, line: int) -> tuple[str, int, str, tuple[int, int], tuple[int, ...], str | None] | None:
    """(the name, its line, the line's text, the value's span, the lines that move to it, the function that picks it
    — None at module level) when the move at ``line`` passes a name whose value asks ``torch.cuda.is_available()``:
    a local of the function that moves (a test, a ``main()``, a trainer's ``__init__``), else a module-level one."""
    got = source(file)
    if got is None:
        return None
    tree, text = got
    lines = text.split("\n")
    names = {n.id for c in ast.walk(tree) if isinstance(c, ast.Call) and c.lineno == line and
             isinstance(c.func, ast.Attribute) and c.func.attr == "to" for n in c.args if isinstance(n, ast.Name)}
    found = _enclosing(tree, line)
    if found is not None:
        func, qual = found
        own = list(_own_nodes(func))
        assigned = {t.id for n in own if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)) for t in (
            n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
        local = names & assigned  # Python's rule: a name the function assigns is its local
        picks = [n for n in own if isinstance(n, ast.Assign) and n.lineno < line and _is_pick(n, local, lines)]
        if picks:
            return _found(picks[-1], lines, own, qual)
        names -= local | {a.arg for a in (*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs)}
    for node in tree.body:
        if isinstance(node, ast.Assign) and _is_pick(node, names, lines):
            return _found(node, lines, list(ast.walk(tree)), None)
    return None


def _is_pick(node: ast.Assign, names: set[str], lines: list[str]) -> bool:
    """``name = "cuda" if torch.cuda.is_available() else "cpu"`` on one line, for one of ``names``."""
    return len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and node.targets[0].id in names and \
        node.lineno == node.end_lineno and "cuda.is_available()" in ast.unparse(node.value) and \
        lines[node.lineno - 1].isascii()


def _found(node: ast.Assign, lines: list[str], scope: list[ast.AST], func: str | None
           ) -> tuple[str, int, str, tuple[int, int], tuple[int, ...], str | None]:
    """The pick's name, line, text and value span; the lines of ``scope`` that move to it; its function."""
    name = node.targets[0].id  # type: ignore[attr-defined]  # checked by _is_pick
    uses = tuple(sorted({c.lineno for c in scope if isinstance(c, ast.Call) and isinstance(
        c.func, ast.Attribute) and c.func.attr == "to" and any(isinstance(a, ast.Name) and a.id == name
                                                               for a in c.args)}))
    return name, node.lineno, lines[node.lineno - 1], (node.value.col_offset, int(node.value.end_col_offset or 0)), \
        uses, func


_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _enclosing(tree: ast.AST, line: int) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef, str] | None:
    """The innermost function whose body holds ``line``, and its dotted name (``Trainer.__init__``)."""
    best, todo = None, [(tree, "")]
    while todo:
        node, prefix = todo.pop()
        for n in ast.iter_child_nodes(node):
            if isinstance(n, (*_FUNCS, ast.ClassDef)) and n.lineno <= line <= int(n.end_lineno or 0):
                if isinstance(n, _FUNCS) and n.body and n.body[0].lineno <= line:
                    best = (n, prefix + n.name)
                todo.append((n, prefix + n.name + "."))
    return best


def _own_nodes(func: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``func``'s body, not those of the functions, lambdas and classes defined in it."""
    todo = list(ast.iter_child_nodes(func))
    while todo:
        n = todo.pop()
        yield n
        if not isinstance(n, (*_FUNCS, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(n))


@contextlib.contextmanager
def reglobals(fixes: Sequence[Fix]) -> Iterator[None]:
    """While a re-run runs: each module-level device name a fix rewrites holds the run's device, as the rewritten
    line would pick it; put back after."""
    saved: list[tuple[dict[str, Any], str, Any]] = []
    for f in fixes:
        if f.reglobal is not None and f.reglobal[1] in f.reglobal[0]:
            names, name, value = f.reglobal
            saved.append((names, name, names[name]))
            names[name] = value
    try:
        yield
    finally:
        for names, name, value in reversed(saved):
            names[name] = value
