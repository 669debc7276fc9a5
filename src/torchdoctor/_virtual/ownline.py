"""One line of the program's own source, read for a fix written at it: the line, its text without the indent, and
that text parsed; None for a library's or the standard library's file, or a line that does not parse alone.
``statements_at``: the statements of a parsed file that hold a line, outermost first; ``source``: a whole file,
parsed, with its text."""

from __future__ import annotations

import ast
import linecache
from typing import Any


def own_line(file: str, line: int) -> tuple[str, str, ast.Module] | None:
    from torchdoctor._guard.ownfile import own_file

    if not file or not own_file(file):
        return None
    raw = linecache.getline(file, line).rstrip("\r\n")
    body = raw.lstrip(" \t")
    try:
        return raw, body, ast.parse(body)
    except SyntaxError:
        return None


def statements_at(node: Any, line: int) -> list[ast.stmt]:
    """The statements under ``node`` (a module, a function, a statement) whose lines hold ``line``, outermost
    first; empty when none does."""
    out: list[ast.stmt] = []
    while True:
        inner = next((s for s in ast.iter_child_nodes(node) if isinstance(s, ast.stmt) and
                      s.lineno <= line <= (s.end_lineno or s.lineno)), None)
        if inner is None:
            return out
        out.append(inner)
        node = inner


__all__ = ["own_line", "statements_at"]


def source(file: str) -> tuple[ast.Module, str] | None:
    """A whole file parsed, with its text; None when it cannot be read or parsed."""
    try:
        with open(file, encoding="utf-8") as fh:
            text = fh.read()
        return ast.parse(text), text
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None


def own_file(file: str) -> bool:
    """The program's own file (not a library's, not torch's)."""
    from torchdoctor._guard.ownfile import own_file as own

    return own(file)


def on_line(file: str, line: int, maker: str) -> bool:
    """The factory's name is written on that line of the file (``torch.empty`` inside ``torch.load`` is not)."""
    text = linecache.getline(file, line)
    return not text or maker.rsplit(".", 1)[-1] + "(" in text
