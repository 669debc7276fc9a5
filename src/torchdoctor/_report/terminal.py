"""Printing reports to a terminal: rich colours when rich is installed and the stream is a terminal (and
``NO_COLOR`` is unset) or ``FORCE_COLOR`` asks for it (CI logs), plain text otherwise; the width problem lists
wrap at. ``--color always|never|auto`` sets these variables, so a child process the command starts agrees.

The text is always the same plain rendering; rich only colours it (kinds, compact tensor forms, ok and problem
headlines), so what a terminal shows and what a pipe gets never differ in content.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

_STYLES = (
    (r"^ok: .*$", "bold green"),
    (r"^\d+ problem\(s\).*$", "bold red"),
    (r"^  (device|meta|saved_device|unsafe_global|quant_incomplete)\b", "bold red"),
    (r"^  (dtype|unsupported_dtype|missing_kernel|unsupported_op|truncated)\b", "bold yellow"),
    (r"\b[a-z0-9_]+\[[0-9, ]*\]@[a-z]+(:\d+)?", "cyan"),
    (r"^(Fix|fix):$", "bold"),
    (r"\b\d+ tensors (under|at) \S+", "bold"),
)


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def set_color(choice: str) -> None:
    """``--color``: ``always`` sets ``FORCE_COLOR`` (and drops ``NO_COLOR``), ``never`` sets ``NO_COLOR``,
    ``auto`` leaves the environment's choice."""
    if choice == "always":
        os.environ.pop("NO_COLOR", None)
        os.environ["FORCE_COLOR"] = "1"
    elif choice == "never":
        os.environ.pop("FORCE_COLOR", None)
        os.environ["NO_COLOR"] = "1"


def _forced() -> bool:
    value = os.environ.get("FORCE_COLOR")
    return value is not None and value.lower() not in ("0", "false", "no")


def use_color(stream: Any = None) -> bool:
    """Colour for a terminal, or anywhere with ``FORCE_COLOR`` set (not ``0``); only with rich installed; never
    with ``NO_COLOR`` set (any non-empty value, it wins over ``FORCE_COLOR`` as no-color.org asks) or a ``dumb``
    terminal that was not forced."""
    stream = sys.stdout if stream is None else stream
    if os.environ.get("NO_COLOR"):
        return False
    if not _forced() and (os.environ.get("TERM") == "dumb" or not _is_tty(stream)):
        return False
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def output_width(stream: Any = None) -> int | None:
    """Columns to wrap at: ``COLUMNS`` when set, the terminal's width on a terminal, else ``None`` (a pipe or a
    file gets whole lines)."""
    stream = sys.stdout if stream is None else stream
    cols = os.environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return int(cols)
    if _is_tty(stream):
        import shutil  # on a terminal only (it imports bz2, lzma and zlib)

        return shutil.get_terminal_size((100, 24)).columns
    return None


_UNSAFE = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if c not in (0x0A, 0x09)}
_UNSAFE.update({c: f"\\u{c:04x}" for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]})


def safe_text(text: str) -> str:
    """Control characters (a path holding ``\\r\\x1b[2K`` could hide a line) and bidi overrides escaped.

    >>> safe_text("a\\x1b[2Kb\\r")
    'a\\\\x1b[2Kb\\\\x0d'
    """
    return text.translate(_UNSAFE)


def emit(text: str, stream: TextIO | None = None) -> None:
    """Print ``text`` (already wrapped): coloured by rich on a terminal, plain otherwise; control characters
    of paths and messages are escaped either way."""
    out = sys.stdout if stream is None else stream
    text = safe_text(text)
    if not use_color(out):
        out.write(text + "\n")
        out.flush()
        return
    from rich.console import Console
    from rich.text import Text

    styled = Text(text)
    for pattern, style in _STYLES:
        styled.highlight_regex(_multiline(pattern), style)
    forced = _forced() and not _is_tty(out)
    Console(file=out, highlight=False, emoji=False, markup=False, soft_wrap=True, force_terminal=True,
            color_system="standard" if forced else "auto").print(styled)


def _multiline(pattern: str) -> str:
    return "(?m)" + pattern
