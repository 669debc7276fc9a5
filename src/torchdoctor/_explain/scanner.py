"""The scanner behind ``explain``: finds error lines in a stream of text and the context around them.

Every signature anchor is found in a few passes over each block (``prefilter``: the anchors' keys as trie-shaped
patterns, then the anchors themselves on the lines they mark; a log's colours are removed only there); only
the window around a hit is matched against the signature's bounded patterns, and only a bounded number of
lines around it is kept as context. Time is linear in the input, memory bounded by the block size. Identical
errors (a ComfyUI ``!!! Exception during processing !!!`` line and its traceback's last line, or one failure
repeated every step) become one group.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from torchdoctor._explain.catalog import signatures
from torchdoctor._explain.chunks import FAR, FRESH, scan_chunked
from torchdoctor._explain.escapes import unescape
from torchdoctor._explain.plaintext import ANSI, fold
from torchdoctor._explain.prefilter import EXACT_BELOW, Prefilter, new_memo
from torchdoctor._explain.sigs_frames import WEAK_PREFIXES
from torchdoctor._explain.signatures import WRITTEN, Signature
from torchdoctor._explain.windows import DIGITS, Shapes, find_fields, own_trace, squeeze, uniform

__all__ = ["BLOCK", "Group", "Scanner", "clean", "normalise"]

BLOCK = 1 << 20          # characters read per block
_LEAD, _TRAIL = 120, 40   # lines of context before / after an error line
_SPAN = 1 << 16           # at most this many characters of context on each side
_LINE_MAX = 4000          # a "line" is cut to this many characters around the anchor
_MAX_HITS = 100_000       # error lines examined in full; beyond that a log is only counted
_CONTEXT_BUDGET = 64 << 20  # characters of context examined overall
_PER_KEY = 1              # occurrences of one error whose context is kept (the rules read the first)
# windows whose fields are remembered: a log made only of errors repeats a few hundred distinct ones, and 512
# thrashed there (half the windows were matched again); a window is at most a few thousand characters
_WINDOWS = 8192
_WEAK: dict[str, bool] = {}  # signature name -> frames-only evidence (``WEAK_PREFIXES``)
_STOP = ("traceback (most recent call last)", "exception during processing", "during handling of the above",
         "the above exception was the direct cause")
_NOT_CONTINUED = ("File ", "Traceback", "During handling", "The above exception", "!!!", "\n", "#", "[")
_FIRST = itemgetter(0)
_CRLF, _HAS_DIGIT = re.compile("\n(?<=\r\n)"), re.compile("[0-9]").search  # (a field's value holds an ASCII digit)


def normalise(block: str, paste: bool = True) -> str:
    r"""Windows line ends and (``paste``) HTML and JSON escapes (``escapes``), terminal colours and the paste
    noise of ``fold`` removed. A log too long to be a paste keeps its colours and escapes and is folded only where
    it is examined (``prefilter``, ``_plain``, ``_context``): each costs more over a whole log than it is worth
    (one more scan of a block is about a twentieth of explain's time on a log).

    >>> normalise("\x1b[31mRuntimeError\x1b[0m\uff1a Input type\uff08float\uff09\r\n")
    'RuntimeError: Input type(float)\n'
    """
    if "\r" in block:
        if _CRLF.search(block):  # found from its rarer "\n" (tqdm redraws: many "\r", few "\r\n"; "in" was slower)
            block = block.replace("\r\n", "\n")
        block = block.replace("\r", "\n")
    if not paste:
        return block
    block = unescape(block)
    if "\x1b" in block:
        block = ANSI.sub("", block)
    return fold(block)


def _blank(line: str) -> bool:
    """Whether a line is blank as a reader sees it: nothing but spaces and terminal colours."""
    return not (ANSI.sub("", line) if "\x1b" in line else line).strip()


def _plain(raw: str) -> str:
    """A piece of a log as the patterns and rules read it: without colours or escapes, folded."""
    return fold(unescape(ANSI.sub("", raw) if "\x1b" in raw else raw))


@dataclass
class Group:
    sig: Signature
    fields: dict[str, str]
    message: str
    evidence: list[str]
    contexts: list[str] = field(default_factory=list)
    count: int = 0
    last: int = 0


def _anchor_table() -> tuple[Prefilter, list[tuple[Signature, ...]]]:
    global _ANCHORS
    if _ANCHORS is None:
        table: dict[str, list[Signature]] = {}
        for sig in signatures():
            for a in sig.anchors:
                table.setdefault(a, []).append(sig)
        _ANCHORS = (Prefilter(list(table), WRITTEN), [tuple(s) for s in table.values()])
    return _ANCHORS


_ANCHORS: tuple[Prefilter, list[tuple[Signature, ...]]] | None = None


def _weak(sig: Signature) -> bool:
    """Whether the signature's evidence is frames only (``WEAK_PREFIXES``)."""
    weak = _WEAK.get(sig.name)
    if weak is None:
        weak = _WEAK[sig.name] = sig.name.startswith(WEAK_PREFIXES)
    return weak


def _line_hits(found: list[tuple[int, int]],
               sigs_of: list[tuple[Signature, ...]]) -> tuple[tuple[int, Signature, bool], ...]:
    """The signatures a line's anchors start, by position (anchors at one place in the table's order), each
    signature at its first place only (a signature is looked at once per line), and whether it is frames only."""
    names: set[str] = set()
    out = []
    for off, sig in sorted([(f, s) for f, i in found for s in sigs_of[i]], key=_FIRST):
        if sig.name not in names:
            names.add(sig.name)
            out.append((off, sig, _weak(sig)))
    return tuple(out)


def _window_end(text: str, msg_end: int, nxt: int) -> int:
    """Where a message's window may end: at the message's end, or at the end of the line after it (ending at
    ``nxt``; -1: too far) when that line continues the message (a wrapped message)."""
    if nxt != -1:
        after = text[msg_end + 1: nxt]
        # the raw line decides when it is plain (most are); colours, escapes or paste noise: its clean form
        if not (after if after.isascii() and "\x1b" not in after and "\\" not in after
                and "&" not in after else _plain(after)).lstrip().startswith(_NOT_CONTINUED):
            return nxt
    return msg_end


def _window(window: str, sig: Signature, shapes: Shapes) -> list[Any]:
    """What a signature's patterns find in ``window`` (the raw text from the window's start to its end): the
    fields, whether a pattern matched, the group key, the window's length, and a place for the group once it is
    known."""
    found, matched = find_fields(squeeze(_plain(window)), sig, shapes)
    return [found, matched, (sig.name, tuple(sorted(found.items()))), len(window), None]


def clean(line: str, limit: int = 300) -> str:
    line = line.strip().strip("│|").strip()
    return line if len(line) <= limit else line[: limit - 3] + "..."


class Scanner:
    """Feeds blocks of text; keeps just enough of the previous block for leading context."""

    def __init__(self) -> None:
        self.buf = ""
        self.groups: dict[tuple[Any, ...], Group] = {}
        self.hits = 0
        self.budget = _CONTEXT_BUDGET
        self.seq = 0
        self.scan_from = 0  # in buf: where the previous block stopped looking for anchors
        self.floor = 0  # in buf: leading context never reaches before the previous (different) error line
        self.prev_end = 0
        self.prev_key: tuple[Any, ...] | None = None
        self.until: dict[str, int] = {}  # per signature, in buf: end of the last window examined
        # repeated windows: their fields, whether a pattern matched, the group key, where they end, the group
        self.cache: dict[tuple[Any, ...], list[Any]] = {}
        self.like: dict[tuple[str, bytes], list[Any]] = {}  # the same, by the window with its digits as 0
        self.shapes = Shapes()  # windows' fields by their shape (``windows``): numbers differ from repeat to repeat
        self.pending: list[str] = []  # blocks of one enormous line, after buf, joined once
        self.pending_len = 0
        # a group of a message (not frames-only evidence) exists: the frames-only signatures' hits are skipped, as
        # ``api`` drops their groups then (in a log of errors they were a seventh of the hits)
        self.spoken = False
        self.lines = new_memo()  # marked lines' anchors, by the line's text (``Prefilter.lines``)
        # per remembered line (by its anchors' list, kept alive here): the signatures it starts, first per name
        self.per_line: dict[int, tuple[list[tuple[int, int]], tuple[tuple[int, Signature, bool], ...]]] = {}
        # repeated paragraphs (``chunks``): their effects by text; while one is recorded, the groups counted, the
        # previous error's key when it began and the first one met in it
        self.chunks: tuple[dict[str, Any], dict[str, Any]] = ({}, {})  # by text, before and after ``spoken``
        self.kept = 0
        self.touched: list[Group] | None = None
        self.entry_key: Any = FRESH
        self.first_key: Any = None
        self.moved = False  # the context's floor moved inside the paragraph being recorded
        # (signature, position, its window's end before) of each hit looked at there
        self.attempts: list[tuple[str, int, int]] | None = None
        self.tried = self.replayed = 0  # paragraphs looked up, and replayed, in this text
        self.last_hits = 0  # hits when the last block was read
        self.raw_at: int | None = 0  # where ``buf`` ends in a text read in place (``inplace``), None: not so read

    def feed(self, block: str, final: bool = False) -> None:
        # a paste is folded whole; a log (program output: no typed full-width punctuation) where it is examined
        block = normalise(block, paste=len(block) < EXACT_BELOW)
        if not final and len(block) >= _SPAN and "\n" not in block \
                and len(self.buf) + self.pending_len + len(block) <= 4 * BLOCK:
            # one enormous line so far: nothing can be cut below (no line end in the last _SPAN characters), so the
            # block is only kept; joining it now would copy the growing line once per block
            self.pending.append(block)
            self.pending_len += len(block)
            self.scan_from = 0
            self.until = {k: v for k, v in self.until.items() if v > 0}
            return
        text = "".join([self.buf, *self.pending, block]) if self.pending else self.buf + block
        self.pending, self.pending_len = [], 0
        self.read(text, final)

    def read(self, text: str, final: bool = False) -> None:
        """Read ``text``: what is kept of the previous blocks (``buf``), then the new block, normalised."""
        cut = len(text)
        if not final:  # hits need _TRAIL lines after them; keep the rest for the next block
            p = len(text)
            for _ in range(_TRAIL + 1):
                p = text.rfind("\n", max(0, p - _SPAN), p)
                if p <= 0:
                    break
            cut = max(p, 0)
            if len(text) - cut > 4 * BLOCK:  # one enormous line: cut it anyway
                cut = len(text) - _SPAN
        # a log (a paste is short) dense with errors: its repeated paragraphs are read once. Finding paragraphs
        # costs a pass over the block, which a log of few errors (the last block had few hits and its start few
        # blank lines) does not repay
        if len(text) >= EXACT_BELOW and (self.hits - self.last_hits >= 64 or text.count(
                "\n\n", self.scan_from, self.scan_from + (1 << 16)) >= 16):
            scan_chunked(self, text, self.scan_from, cut, _MAX_HITS)
        else:
            self._lines_hits(text, self.scan_from, cut)
        self.last_hits = self.hits
        keep = cut
        for _ in range(_LEAD):
            keep = text.rfind("\n", max(0, keep - _SPAN), keep)
            if keep <= 0:
                keep = 0
                break
        keep = max(keep, cut - 4 * _SPAN, 0)
        self.buf = text[keep:]
        self.scan_from = cut - keep
        self.floor = max(0, self.floor - keep)
        self.prev_end = max(0, self.prev_end - keep)
        self.until = {k: v - keep for k, v in self.until.items() if v > keep}

    def _lines_hits(self, text: str, start: int, cut: int) -> int:
        """The hits of the marked lines of ``text[start:cut]``; returns the end of what they read (``FAR``: not
        known, or before ``start``)."""
        prefilter, sigs_of = _anchor_table()
        rfind, hit, per_line = text.rfind, self._hit, self.per_line
        reach = 0
        for ls, found, line in prefilter.lines(text, start, cut, self.lines):
            if line is not None:  # a whole line: what its anchors start is worked out once per distinct line
                got = per_line.get(id(found))
                if got is None:
                    if len(per_line) > _WINDOWS:
                        per_line.clear()
                    got = per_line[id(found)] = (found, _line_hits(found, sigs_of))
                spoken = self.spoken
                for off, sig, weak in got[1]:
                    if weak and spoken:  # frames speak only when no message does (``api``): once one has, moot
                        self.hits += 1
                    else:
                        if self.attempts is not None:
                            self.attempts.append((sig.name, ls + off, self.until.get(sig.name, -1)))
                        r = hit(text, ls + off, ls, sig, weak)
                        if r > reach:
                            reach = r
                continue
            reach = FAR
            seen: set[tuple[int, str]] = set()
            for pos, sig in sorted([(ls + f, s) for f, i in found for s in sigs_of[i]], key=_FIRST):
                low = pos - _LINE_MAX
                nl = rfind("\n", low if low > 0 else 0, pos)
                start = nl + 1 if nl != -1 or low < 0 else pos - 300  # an enormous line: look near the anchor
                if (start, sig.name) not in seen:
                    seen.add((start, sig.name))
                    hit(text, pos, start, sig, _weak(sig))
        return reach

    def _hit(self, text: str, pos: int, ls: int, sig: Signature, weak: bool) -> int:
        # once per error line of a log: written for speed (no min/max calls, bound methods), a log made only of
        # errors has thousands a megabyte
        self.hits += 1
        until, name = self.until, sig.name
        if self.hits > _MAX_HITS or pos < until.get(name, -1):  # or inside the window looked at last
            return 0
        if weak and self.spoken:  # frames speak only when no message does (``api``): once one has, they are moot
            return 0
        find, size = text.find, len(text)
        le = find("\n", pos, pos + _LINE_MAX)
        if le == -1:
            le = pos + _LINE_MAX if pos + _LINE_MAX < size else size
        msg_end = le
        for _ in range(sig.follow):  # a blank line ends the message (the next paragraph is not part of it)
            nxt = find("\n", msg_end + 1, msg_end + 1 + _LINE_MAX)
            if nxt == -1 or nxt - msg_end < 64 and _blank(text[msg_end + 1:nxt]):
                break
            msg_end = nxt
        # a wrapped message: the patterns also see the line before and a continuation line after
        if ls > 0 and sig.before:
            start = text.rfind("\n", ls - 400 if ls > 400 else 0, ls - 1) + 1
        else:
            start = ls
        nxt = find("\n", msg_end + 1, msg_end + 401)
        reach = nxt + 1  # the end of what this hit reads (a paragraph's replay needs it)
        if nxt == -1:
            reach = FAR
            if msg_end < size <= msg_end + 401:  # the last line of the text
                nxt = size
        # the window's text is all its patterns read, and the key of what it gave: a log of errors repeats its
        # windows (the line after a message only decides where the window ends: a frame or the next text's first
        # line, which differ from one repeat to the next, are not part of the key)
        lo = pos - sig.before
        if lo < start:
            lo = start
        hi = _window_end(text, msg_end, nxt)
        if hi > pos + sig.after + 200 * sig.follow:
            hi = pos + sig.after + 200 * sig.follow
        memo = (name, text[lo:hi])
        got = self.cache.get(memo)
        if got is None:
            if len(self.cache) > _WINDOWS:
                self.cache.clear()
            got = self.cache[memo] = self._alike(memo[1], sig)
        fields, matched, key, hi, group = got
        until[name] = hi + lo
        if sig.require_pattern and not matched:
            return reach
        # a different error: its context starts after the previous one (frames-only evidence never moves it)
        if key != self.prev_key and not weak:
            if self.prev_key is FRESH:  # the first in a paragraph being recorded (``chunks``): against the real one
                self.first_key = key
                if key != self.entry_key:
                    self.floor = self.prev_end
            else:
                self.floor = self.prev_end
                self.moved = True
        if group is None:
            group = self.groups.get(key)
            if group is None:
                message = _plain(text[ls:msg_end])
                evidence = [clean(x) for x in message.split("\n") if x.strip()][: 1 + sig.follow]
                group = self.groups[key] = Group(sig, dict(fields), message[:_LINE_MAX], evidence)
                self.spoken = self.spoken or not weak
            got[4] = group
        group.count += 1
        self.seq += 1
        group.last = self.seq
        if self.touched is not None:
            self.touched.append(group)
        if group.count <= _PER_KEY and self.budget > 0:
            group.contexts.append(self._context(text, ls, msg_end))
        if not weak:
            self.prev_key, self.prev_end = key, msg_end
        return reach

    def _alike(self, window: str, sig: Signature) -> list[Any]:
        """``_window``'s answer, shared with a window met before that differs only in its ASCII digits (a time stamp,
        a frame's line number) where ``sig`` is ``uniform`` and none of that window's fields holds a digit: the
        patterns then matched the same places, and what they took there is the same text. Without HTML or JSON
        escapes only (undoing ``&#39;`` or ``\\u0027`` reads the digits)."""
        if "&" in window or "\\" in window or not uniform(sig):
            return _window(window, sig, self.shapes)
        like = (sig.name, window.encode("utf-8", "surrogatepass").translate(DIGITS))
        got = self.like.get(like)
        if got is None:
            got = _window(window, sig, self.shapes)
            if not any(map(_HAS_DIGIT, got[0].values())):
                if len(self.like) > _WINDOWS:
                    self.like.clear()
                self.like[like] = got
        return got

    def _context(self, text: str, ls: int, le: int) -> str:
        lead, lo = ls, max(self.floor, ls - _SPAN)
        if lo < ls - 1 < lo + 16384 and text.count("\n", lo, ls - 1) < _LEAD:
            lead = 0  # (fewer lines than _LEAD since the floor: the walk below would pass them all, then stop at 0)
        for _ in range(_LEAD if lead else 0):
            if lead <= self.floor or lead <= 0:
                break
            lead = text.rfind("\n", lo, lead - 1) + 1
        lead = max(lead, self.floor, ls - _SPAN)
        trail_end = le
        for _ in range(_TRAIL):
            nxt = text.find("\n", trail_end + 1, le + _SPAN)
            if nxt == -1:  # the text's last line has no line end of its own
                trail_end = min(len(text), le + _SPAN) if trail_end + 1 < len(text) else trail_end
                break
            trail_end = nxt
        raw_trail = text[le:trail_end]
        raw_trail = ANSI.sub("", raw_trail) if "\x1b" in raw_trail else raw_trail
        trail = raw_trail.lower()
        if len(trail) != len(raw_trail):  # U+0130 and the like lower to two characters: positions must not move
            trail = fold(raw_trail).lower()
        # "!!! Exception during processing !!! <message>" (ComfyUI) is followed by its own traceback
        skip = own_trace(_plain(text[ls:le]), trail)  # its own traceback follows: the stops come after it
        stop = len(trail)  # the first of the stops: each later one is looked for only before the one found
        for s in _STOP:
            i = trail.find(s, skip, stop + len(s) - 1)
            stop = i if i != -1 else stop
        trail = trail[:stop]
        # rules read ASCII words: a context is not folded (a log's are long), only its colours removed
        head = text[lead:le]
        ctx = (ANSI.sub("", head) if "\x1b" in head else head) + raw_trail[: len(trail)]
        self.budget -= len(ctx)
        return unescape(ctx)  # a log's escapes are undone where it is examined (a paste's were, whole)
