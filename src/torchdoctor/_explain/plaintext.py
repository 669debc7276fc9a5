"""Terminal colours and paste noise in a text, and positions across their removal.

A log keeps its colours and paste noise (full-width punctuation, typographic quotes, box borders) until a line of
it is examined: ``fold`` maps the noise one character for one, so positions do not move; ``strip`` removes the
colours and says where they were, so that a position found in the clean text maps back (``raw_position``) and
the other way (``clean_position``).
"""

from __future__ import annotations

import re

__all__ = ["ANSI", "clean_position", "fold", "raw_position", "strip"]

# colours and cursor moves (CSI), window titles and links (OSC), the one-character sequences, and the character set
# choices ``tput sgr0`` writes after every colour (``ESC ( B``: an escape, one intermediate byte, a final one)
ANSI = re.compile(r"\x1b(?:\[[0-9;?]{0,32}[ -/]{0,4}[@-~]|\][^\x07\x1b]{0,512}(?:\x07|\x1b\\)|[@-Z\\-_]|[()*+\-./#%][0-~])")


# Pasted text: full-width punctuation (CJK input methods), typographic quotes, no-break spaces, box-drawing
# borders (rich tracebacks). Each maps to one character, so positions in the text do not move.
_FOLD = {0xFF08: "(", 0xFF09: ")", 0xFF1A: ":", 0xFF0C: ",", 0xFF01: "!", 0xFF07: "'", 0xFF02: '"', 0xFF3B: "[",
         0xFF3D: "]", 0xFF1B: ";", 0xFF0E: ".", 0x3001: ",", 0x3002: ".", 0x2018: "'", 0x2019: "'", 0x201C: '"',
         0x201D: '"', 0x00A0: " ", 0x3000: " ", 0x2502: " ", 0x2503: " ", 0x2551: " ", 0x0130: "I", 0xFEFF: " "}


def fold(text: str) -> str:
    """The paste noise above as ASCII, one character for one, so positions do not move and ``lower()`` keeps the
    length (U+0130 alone would lower to two characters).

    >>> fold("RuntimeError\uff1a Input type\uff08float\uff09")
    'RuntimeError: Input type(float)'
    """
    if text.isascii():
        return text
    for code, ascii_char in _FOLD.items():  # a few scans beat a regex callback per character
        char = chr(code)
        if char in text:
            text = text.replace(char, ascii_char)
    return text


def strip(text: str) -> tuple[str, list[tuple[int, int]]]:
    r"""``text`` without terminal escape sequences, and where they were: ``(position in the result, characters
    removed so far)`` per sequence, for ``raw_position``.

    >>> strip("\x1b[31mRuntimeError\x1b[0m: x")
    ('RuntimeError: x', [(0, 5), (12, 9)])
    """
    if "\x1b" not in text:
        return text, []
    spans: list[tuple[int, int]] = []
    removed = 0
    for m in ANSI.finditer(text):
        at = m.start() - removed
        removed += m.end() - m.start()
        spans.append((at, removed))
    return (ANSI.sub("", text) if spans else text), spans


def raw_position(spans: list[tuple[int, int]], p: int) -> int:
    """The position in the text before ``strip`` of the character at ``p`` after it."""
    shift = 0
    for at, removed in spans:
        if at > p:
            break
        shift = removed
    return p + shift


def clean_position(spans: list[tuple[int, int]], p: int) -> int:
    """The position after ``strip`` of the character at ``p`` before it (the start of a sequence ``p`` is in)."""
    prev = 0
    for at, removed in spans:
        if p <= at + prev:
            break
        if p < at + removed:
            return at
        prev = removed
    return p - prev
