"""A device as the program's own line writes it: the innermost function of an own file holding a line (files parsed
once per process, a fix's lines only), and the device a line gives a factory's ``device=`` or a ``.to()`` /
``.cuda()`` — a run-time pick (a name, a helper's call) or a device written out. Read by ``meetsite`` and
``devname``."""

from __future__ import annotations

import ast
import linecache
from typing import Any

__all__ = ["device_name", "enclosing", "function_at", "tree_of", "written_device"]

_PARSED: dict[str, ast.Module | None] = {}  # an own file's parse, for the run's process (a fix's lines only)


def tree_of(file: str) -> ast.Module | None:
    if file not in _PARSED:
        try:
            _PARSED[file] = ast.parse("".join(linecache.getlines(file)))
        except (SyntaxError, ValueError):
            _PARSED[file] = None
    return _PARSED[file]


def function_at(tree: ast.Module, line: int) -> Any:
    """The innermost function holding ``line``, else the module."""
    return min((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and
                n.lineno <= line <= (n.end_lineno or n.lineno)),
               key=lambda n: (n.end_lineno or n.lineno) - n.lineno, default=tree)


def enclosing(file: str, line: int) -> Any:
    """The innermost function of ``file`` holding ``line``, else its module; None when the file does not parse."""
    tree = tree_of(file)
    return function_at(tree, line) if tree is not None else None


def _literal(node: ast.expr) -> bool:
    """A device written out: ``"cpu"``, ``0``, ``torch.device("cuda", 0)``."""
    if isinstance(node, ast.Constant):
        return True
    return isinstance(node, ast.Call) and ast.unparse(node.func) in ("torch.device", "device") and \
        all(isinstance(a, ast.Constant) for a in (*node.args, *(k.value for k in node.keywords)))


def written_device(file: str, line: int) -> tuple[str, bool] | None:
    """(the device the program's ``line`` gives a factory's ``device=`` or a ``.to()`` / ``.cuda()``, as written;
    whether it is written out) — a run-time pick (``mm.intermediate_device()``, ``dev``) first; None when the line
    gives none or is not the program's."""
    from torchdoctor._virtual.ownline import own_line

    here = own_line(file, line)
    if here is None:
        return None
    found: list[tuple[str, bool]] = []
    for n in ast.walk(here[2]):
        if not isinstance(n, ast.Call):
            continue
        dev = next((k.value for k in n.keywords if k.arg == "device"), None)
        if dev is None and isinstance(n.func, ast.Attribute) and n.func.attr in ("to", "cuda") and n.args:
            dev = n.args[0]
        if dev is not None:
            found.append((ast.unparse(dev), _literal(dev)))
    return min(found, key=lambda d: d[1], default=None)


def device_name(file: str, line: int) -> str | None:
    """The program's name for the device at the use's line: a module-level device pick (``device =
    torch.device("cuda" if torch.cuda.is_available() else "cpu")``) bound before it that its function does not bind
    again; None when there is none."""
    tree = tree_of(file)
    fn = enclosing(file, line)
    if tree is None or fn is None:
        return None
    mine = set() if fn is tree else {a.arg for a in (*fn.args.args, *fn.args.kwonlyargs)} | {
        n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    written = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) and \
                stmt.lineno < line and stmt.targets[0].id not in mine:
            if "is_available()" in ast.unparse(stmt.value):
                return stmt.targets[0].id
            if "dev" in stmt.targets[0].id.lower() and _literal(stmt.value) and (
                    text := ast.unparse(stmt.value).strip("'\"")).startswith(("cuda", "xpu", "mps", "torch.device(")) \
                    and "cpu" not in text and "meta" not in text:  # ``device = "cuda"``: the program's own name
                written.append(stmt.targets[0].id)
    return written[0] if len(set(written)) == 1 else None
