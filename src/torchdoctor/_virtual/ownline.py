"""One line of the program's own source, read for a fix written at it: the line, its text without the indent, and
that text parsed; None for a library's or the standard library's file, or a line that does not parse alone."""

from __future__ import annotations

import ast
import linecache


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


__all__ = ["own_line"]
