"""A few passes over a log for every signature anchor at once.

Searching each of about a hundred anchors with its own ``str.find`` costs a hundred passes over the text. Instead
every anchor gets a short key: a piece of the anchor that real texts never re-capitalise and that starts with (or,
through a look-behind, holds) one of a few pass characters. The keys of one pass character go into one regular
expression shaped as a trie and starting with that literal character, so the regex engine skips to that
character's next occurrence in a tight C loop and tries the keys only there — a few passes in C over the raw text,
with no lower-cased or colour-free copy of a whole log. A line with a key is then cleaned (``plaintext``),
lower-cased and checked for the anchors themselves, so what is found is exactly what the anchors say; the keys
only decide which lines are worth that look.

The keys assume that only some words change case in real texts (devices, dtypes, names, the first letter of a
message). Short texts — a paste, one exception — are matched on a lower-cased copy instead, so that even an
all-capitals paste is read; logs over ``EXACT_BELOW`` characters take the fast path.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence

from torchdoctor._explain.escapes import unescape
from torchdoctor._explain.keys import _BACK, _PASSES, _key_span, _plain_keys, _stable, _trie, key_of
from torchdoctor._explain.plaintext import clean_position, fold, raw_position, strip

__all__ = ["EXACT_BELOW", "Memo", "Prefilter", "key_of", "new_memo"]

EXACT_BELOW = 1 << 18
_PER_LINE = 32  # keys looked up one by one on one line
_MEMO_LINE = 3000  # longer marked lines are not remembered
_LINES = 8192  # distinct lines whose anchors are remembered (a log of errors repeats a few hundred; 1024 thrashed)
# What a logger writes before each line of a log (a time stamp, a rank tag): a log of errors repeats its lines under
# a new one each time, so a marked line's anchors are remembered by the text after it (with the blank after it and
# a level name: "ERROR about ..." may start an anchor), where the prefix is inert (``Prefilter._inert``).
_PREFIX = re.compile(r"(?:\[?(?:[0-9]{4}-[0-9]{2}-[0-9]{2}[T ])?[0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]{1,9})?"
                     r"(?:Z|[+-][0-9]{2}:?[0-9]{2})?\]?(?: -| \|)?|\[rank[0-9]{1,5}\]:)+")
_DIGITS = bytes.maketrans(b"123456789", b"000000000")  # over ASCII bytes: a C table look-up
_PREFIXED = frozenset("0123456789[")
_RARE, _RARE_FROM = 400, 1 << 13  # a pass character met more often than once in _RARE characters is common


# what marked lines held, by their text: for a log's blocks, and for short (lower-cased) texts apart; a log's lines
# after an inert prefix by the prefix's length (as a negative number) and the text after it
Memo = dict[int, dict[str, list[tuple[int, int]]]]


def new_memo() -> Memo:
    """An empty memo for ``Prefilter.hits``: one per text read, so nothing outlives it."""
    return {False: {}, True: {}}


class Prefilter:
    """The anchors' keys as one pattern per pass character; ``hits`` yields where anchors are, one look per line."""

    def __init__(self, anchors: Sequence[str], written: Mapping[str, str] | None = None) -> None:
        self.anchors = tuple(anchors)
        keys: dict[str, dict[tuple[str, str], set[int]]] = {c: {} for c in _PASSES}
        without: list[str] = []
        danger = set(self.anchors)  # what must not start inside a stripped prefix (``_inert``)
        for i, a in enumerate(self.anchors):
            ok = _stable(a)
            # identifiers and titles are written in capitals (CUBLAS_STATUS_NOT_SUPPORTED, Unhandled FakeTensor Device
            # Propagation), camelCase ones as ``written`` spells them: those forms get keys too, at no extra pass
            for n, form in enumerate((a, a.upper(), a.title(), (written or {}).get(a, a))):
                span = _key_span(form, ok)
                if span is None:
                    if n == 0:
                        without.append(a)
                    continue
                s, e, at = span
                keys[form[at]].setdefault((form[at + 1: e], form[s: e]), set()).add(i)
                danger.add(form[s: e].lower())
        self.passes: list[tuple[re.Pattern[str], dict[str, tuple[int, ...]]]] = []
        self._marking: list[tuple[str, re.Pattern[str]]] = []  # (the character every match starts with, pattern)
        for ch, ks in keys.items():
            if not ks:
                continue
            # what the pattern matches is the shortest key at a place: it stands for every key it begins
            by_match = {ch + rest: tuple(sorted({i for (other, _), of in ks.items() if other.startswith(rest)
                                                 for i in of})) for rest, _ in ks}
            self.passes.append((re.compile(re.escape(ch) + _trie(sorted(ks))), by_match))
            self._marking.append((ch, self.passes[-1][0]))
        index = {a: i for i, a in enumerate(self.anchors)}
        self.plain = [(piece, tuple(index[a] for a in of)) for piece, of in _plain_keys(without)]
        danger.update(piece for piece, _ in self.plain)
        # a line is marked by a key, or by what plain pieces that begin alike share (the Chinese "找不到..."
        # wordings): one pass for them all, a pattern (on a UCS-2 log faster than ``str.find``); a line so marked
        # alone holds no anchor, and reading it finds none (``_segments`` looks for the pieces themselves)
        alike: dict[str, list[str]] = {}
        for piece, _ in self.plain:
            alike.setdefault(piece[:3], []).append(piece)
        self._marking += [(os.path.commonprefix(g)[0], re.compile(re.escape(os.path.commonprefix(g))))
                          for g in alike.values()]
        self._danger = tuple(sorted({re.sub("[1-9]", "0", d) for d in danger}))
        self._inert_memo: dict[bytes, bool] = {}

    def _inert(self, prefix: str) -> bool:
        """Whether a line's anchors are found as well after ``prefix`` as with it: it holds no pass character,
        colour, escape or non-ASCII character, and no anchor, key or plain piece can start inside it (none starts
        with what follows any of its characters, nor lies inside it). Decided on its shape (digits as 0, lower
        case), which only makes more strings alike, so a shape found inert is inert for each prefix of it."""
        if not prefix.isascii():
            return False
        shape = prefix.encode("ascii").translate(_DIGITS)
        got = self._inert_memo.get(shape)
        if got is None:
            raw = shape.decode("ascii")
            low = raw.lower()  # the passes read the raw text (an upper-case T is no pass character), anchors lower
            got = not any(c in raw for c in _PASSES + "\x1b\\&\n") and not any(
                d.startswith(low[j:]) or low[j:].startswith(d) for j in range(len(low)) for d in self._danger)
            if len(self._inert_memo) > 256:
                self._inert_memo.clear()
            self._inert_memo[shape] = got
        return got

    def hits(self, text: str, start: int, cut: int, memo: Memo | None = None) -> Iterator[tuple[int, int]]:
        """``(position, anchor index)`` of every anchor in ``text[start:cut]``, first occurrence per line, by
        ``lines``."""
        for base, found, _ in self.lines(text, start, cut, new_memo() if memo is None else memo):
            for f, i in found:
                yield base + f, i

    def lines(self, text: str, start: int, cut: int, memo: Memo) -> Iterator[tuple[int, list[tuple[int, int]],
                                                                                     str | None]]:
        """Per marked line of ``text[start:cut]``, in order: its start, its anchors as ``(offset, anchor index)``
        and, for a whole line short enough to be remembered, its text (the same list comes back for the same
        text; a line cut by a block's end, a very long one, or a short text with colours gives ``None``; a line
        after a logger's prefix, ``_PREFIX``, is remembered by the text after it and the prefix's length). A log
        keeps its terminal colours (``strip`` is costly over a whole log): the passes read the raw text, and a
        line they mark is read without its colours. ``memo`` (from ``new_memo``) holds what repeated lines hold
        across the blocks of one text."""
        exact = len(text) < EXACT_BELOW
        clean, spans = strip(text) if exact and "\x1b" in text else (text, [])
        if spans:  # a short text not cleaned by the caller (the end of a log): read it cleaned (a lone escape stays)
            yield 0, [(raw_position(spans, ls + f), i) for ls, found, _ in
                      self.lines(clean, clean_position(spans, start), clean_position(spans, cut), memo)
                      for f, i in found], None
            return
        source = fold(text).lower() if exact else text  # fold keeps lower() length-preserving
        # first the lines that hold a key, one search per line and pass (a log of errors marks a third of its
        # lines); then each marked line is read as the keys' walk (``_segments``) would read it within the whole
        # text, and what it holds is remembered by the line's text: a log repeats its error lines
        marked: dict[int, int] = {}
        tfind, trfind = text.find, text.rfind
        sfind = source.find
        for ch, rx in self._marking:  # one search per marked line, which it then skips
            search, match = rx.search, rx.match
            # every match starts with ``ch``: while it is rare in a long text it is found by ``str.find`` (memchr,
            # ~0.05 ns a character where ``re``'s own skip loop reads ~0.7 on a UCS-2 log) and the pattern tried
            # there (~0.4 us a place, ``re`` ~0.03-0.13); once common ("t", "l"), the pattern's own loop goes on.
            # The same leftmost match either way: the same lines marked
            rare, tries, p = cut - start >= _RARE_FROM, 0, start
            while True:
                if rare:
                    p = sfind(ch, p, cut)
                    if p == -1:
                        break
                    tries += 1
                    rare = tries * _RARE < p - start + _RARE_FROM
                    if match(source, p, cut) is None:
                        p += 1
                        continue
                else:
                    m = search(source, p, cut)
                    if m is None:
                        break
                    p = m.start()
                nl = trfind("\n", start, p)
                ls = nl + 1 if nl != -1 else start
                le = tfind("\n", p, cut)
                if le == -1:
                    le = cut
                marked[ls] = le
                p = le + 1
        lines = memo[exact]
        prefix = None if exact else _PREFIX.match
        for ls in sorted(marked):
            le = marked[ls]
            if le - ls <= _MEMO_LINE and (ls == 0 or source[ls - 1] == "\n"):
                into = lines
                line = source[ls:le]
                if prefix is not None and line[:1] in _PREFIXED:
                    # the anchors' offsets (and the order the keys' walk finds them in) depend on the prefix only
                    # through its length once it is inert: lines under prefixes of one length share a memo
                    m = prefix(source, ls, le)
                    if m is not None and m.end() < le and self._inert(m.group()):
                        into = memo.setdefault(ls - m.end(), {})
                        line = source[m.end():le]
                found = into.get(line)
                if found is None:
                    found = self._read_line(source, text, exact, ls, le)
                    if len(into) > _LINES:
                        into.clear()
                    into[line] = found
                yield ls, found, line
            else:  # a line cut by a block's end, or too long to remember: read where it is
                yield ls, self._read_line(source, text, exact, ls, le), None

    def _read_line(self, source: str, text: str, exact: bool, ls: int, le: int) -> list[tuple[int, int]]:
        """The anchors on the marked line ``[ls, le)`` as ``(offset from ls, index)``: the keys' walk over the line
        (``_segments``), then each segment it marks checked for the anchors themselves."""
        out: list[tuple[int, int]] = []
        segments = self._segments(source, text, ls, le)
        seen: dict[tuple[str, tuple[int, ...]], list[tuple[int, int]]] = {}
        for s in sorted(segments):
            e, which = segments[s]
            raw = source[s:e] if exact else text[s:e]
            key = (raw, tuple(which) if len(which) == 1 else tuple(sorted(which)))
            found = seen.get(key)
            if found is None:
                found = seen[key] = self._check(raw, exact, key)
            out.extend((s - ls + f, i) for f, i in found)
        return out

    def _segments(self, source: str, text: str, start: int, cut: int) -> dict[int, tuple[int, set[int]]]:
        """Per segment start, its end and the anchors whose keys are in it: a segment runs from a key's line start
        (at most ``_BACK`` before it) to the line's end (at most 2,000 after it)."""
        lines: dict[int, tuple[int, set[int]]] = {}
        tfind, trfind = text.find, text.rfind
        for rx, by_match in self.passes:
            # one search per key found: the next key on the same line (keys may overlap) or on a later line; a
            # line's bounds are found once, at its first key
            search, get = rx.search, by_match.get
            m = search(source, start, cut)
            le, n = -1, 0
            which: set[int] = set()
            while m is not None:
                p = m.start()
                if p < le:  # another key on the line
                    if m.end() > le:  # one that runs past a cut-off line's end: as if the line ended there
                        m = search(source, p, le)
                        if m is None:
                            m = search(source, le + 1, cut)
                            continue
                        p = m.start()
                    n += 1
                    if n > _PER_LINE:  # a line made of keys (garbage, or built to be slow): the rest in one call
                        for k in set(rx.findall(source, p, le)):
                            which.update(get(k, ()))
                        m = search(source, le + 1, cut)
                        continue
                elif p == le:  # the character after a cut-off line is not looked at
                    m = search(source, le + 1, cut)
                    continue
                else:  # a new line: its bounds
                    back = p - _BACK if p - _BACK > start else start
                    nl = trfind("\n", back, p)
                    ls = nl + 1 if nl != -1 else back
                    le = tfind("\n", p, p + 2000)
                    le = p + 2000 if le == -1 else le
                    if le > cut:
                        le = cut
                    got = lines.get(ls)
                    if got is None:
                        got = lines[ls] = (le, set())
                    which, n = got[1], 1
                which.update(get(m.group(), ()))
                m = search(source, p + 1, cut)
        for piece, which_plain in self.plain:
            p = source.find(piece, start, cut)
            while p != -1:
                ls, le = self._line(text, start, cut, p)
                lines.setdefault(ls, (le, set()))[1].update(which_plain)
                p = source.find(piece, le + 1, cut)
        return lines

    @staticmethod
    def _line(text: str, start: int, cut: int, p: int) -> tuple[int, int]:
        nl = text.rfind("\n", max(start, p - _BACK), p)
        ls = nl + 1 if nl != -1 else max(start, p - _BACK)
        le = text.find("\n", p, p + 2000)
        return ls, min(cut, p + 2000 if le == -1 else le)

    def _check(self, raw: str, exact: bool, key: tuple[str, tuple[int, ...]]) -> list[tuple[int, int]]:
        """Where in the line ``raw`` the anchors ``key[1]`` are, read without colours or escapes."""
        spans: list[tuple[int, int]] = []
        if exact:
            segment = raw
        else:
            segment, spans = strip(fold(raw))
            segment = segment.lower()
        if "\\" in segment or "&" in segment:
            # a log keeps its JSON / HTML escapes until a line is examined; undoing them only shortens the
            # line, so a position found after it is at or before the anchor, within the window the patterns read
            segment = unescape(segment)
        return [(raw_position(spans, f), i) for i in key[1] if (f := segment.find(self.anchors[i])) != -1]
