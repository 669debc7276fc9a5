"""A log given as one string, read in its blocks without a copy of each block.

``explain(text)`` reads a string in blocks as it reads a stream. A block of a stream is a new string anyway; a
block of a string was a slice of it (a copy), then joined to what the scanner keeps of the blocks before it
(``Scanner.buf``, a second copy) and, in a log with carriage returns (progress bars redrawn in place), normalised
(a third). Each copy of a megabyte-sized block is fresh memory the system must map and zero, which cost about a
fifth of explain's time on an app's log. Here the scanner's text for a block is cut from the string once, from
where ``buf`` starts to the block's end, and normalised in that one piece where that gives the very text
``Scanner.feed`` builds:
- ``buf`` is that piece's own start, normalised (``Scanner.raw_at``: the string was read this way up to its end, and
  normalising kept every length: no Windows line end was in it);
- the piece holds no Windows line end either (``\\r\\n`` becomes one character, and one split by a block's end is
  two line ends when read block by block), so normalising the piece is normalising ``buf``'s source and the block
  apart;
- the block is read as a log (``EXACT_BELOW`` characters or more: a paste's escapes and colours are undone once,
  not twice), is not the end, and holds a line end (one enormous line is kept aside, ``Scanner.pending``).
Anything else is read the ordinary way, and the rest of the string with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torchdoctor._explain.prefilter import EXACT_BELOW
from torchdoctor._explain.scanner import _CRLF, BLOCK

__all__ = ["Text", "feed_span"]


class Text:
    """A string to be read in blocks: iterating gives the blocks (``BLOCK`` characters each, as a stream's), and
    ``api`` reads them in place (``feed_span``)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __iter__(self) -> Iterator[str]:
        text = self.text
        for i in range(0, len(text), BLOCK):
            yield text[i: i + BLOCK]


def feed_span(sc: Any, source: str, i: int, j: int) -> None:
    """``sc.feed(source[i:j])``, with one copy where that reads the same text (above)."""
    n = len(sc.buf)
    if sc.raw_at == i and n <= i and not sc.pending and j - i >= EXACT_BELOW and (
            source.find("\n", i, j) != -1 or source.find("\r", i, j) != -1):
        raw = source[i - n: j]
        if "\r" not in raw:
            sc.read(raw)
            sc.raw_at = j
            return
        if not _CRLF.search(raw):
            sc.read(raw.replace("\r", "\n"))
            sc.raw_at = j
            return
    sc.raw_at = None
    sc.feed(source[i:j])
