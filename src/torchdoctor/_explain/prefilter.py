"""One pass over a log for every signature anchor at once.

Searching each of about a hundred anchors with its own ``str.find`` costs a hundred passes over the text. Instead
every anchor gets a short key: a piece of the anchor that real texts never re-capitalise and that starts with a
character rare in logs (``x``, ``q``, ``v``, ``_`` ...). All keys go into one regular expression shaped as a trie,
so the regex engine looks past every position whose character starts no key and stops only where a key begins —
one pass in C over the raw text, with no lower-cased copy of a whole log. A line with a key is then lower-cased
and checked for the anchors themselves, so what is found is exactly what the anchors say; the keys only decide
which lines are worth that look.

The keys assume that only some words change case in real texts (devices, dtypes, names, the first letter of a
message). Short texts — a paste, one exception — are matched on a lower-cased copy instead, so that even an
all-capitals paste is read; logs over ``EXACT_BELOW`` characters take the fast path.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence

__all__ = ["EXACT_BELOW", "Prefilter", "key_of"]

EXACT_BELOW = 1 << 18
# Words real texts write in capitals anywhere (CUDA, CPU, BFloat16, PyTorch, FakeTensor ...): never part of a key.
_CASED = re.compile(r"(?<![a-z])(?:cuda|cpu|xpu|mps|gpu|hpu|npu|nvidia|float|half|double|long|bool|int\d|bfloat|"
                    r"bf16|fp16|fp8|flash|torch|pytorch|python|macos|c\+\+|faketensor|params|int8params|xformers|"
                    r"cublas|ipex|intel|apple|metal)")
# Start characters, rarest in logs first: the fewer positions start a key, the faster the pass.
_RARE = "`[_'(zqxjkvwyfb"
_MIN, _MAX = 6, 14
_BACK = 96  # an anchor starts at most this far before its key


def _stable(anchor: str) -> list[bool]:
    ok = [True] * len(anchor)
    ok[0] = False  # the first letter of a message is capitalised
    for m in _CASED.finditer(anchor):
        ok[m.start(): m.end()] = [False] * (m.end() - m.start())
    return ok


def key_of(anchor: str) -> str:
    """The key of one anchor: a case-stable piece of it, starting at its rarest usable character, or "" when
    it has none (the anchor is then found by a plain search for its longest case-stable piece).

    >>> key_of("expected all tensors to be on the same device")
    'xpected all te'
    >>> key_of("and weight type (")
    'weight type ('
    >>> key_of("does not exist")
    ''
    """
    span = _key_span(anchor)
    return anchor[span[0]: span[1]] if span else ""


def _key_span(anchor: str) -> tuple[int, int] | None:
    ok = _stable(anchor)
    best: tuple[tuple[int, int], tuple[int, int]] | None = None
    for i, ch in enumerate(anchor):
        rank = _RARE.find(ch)
        if not ok[i] or rank == -1:
            continue
        j = i
        while j < len(anchor) and ok[j] and j - i < _MAX:
            j += 1
        if j - i >= _MIN and (best is None or (rank, i - j) < best[0]):
            best = ((rank, i - j), (i, j))
    return best[1] if best else None


def _plain_keys(anchors: Sequence[str]) -> list[tuple[str, tuple[str, ...]]]:
    """Few lower-case pieces that together cover the anchors without a key: each is one ``str.find`` pass, so a
    piece shared by several anchors is chosen first."""
    pieces: dict[str, set[str]] = {}
    for a in anchors:
        ok = _stable(a)
        for i in range(len(a)):
            for j in range(i + 8, len(a) + 1):
                if not all(ok[i:j]):
                    break
                pieces.setdefault(a[i:j], set()).add(a)
    left: set[str] = set(anchors)
    out: list[tuple[str, tuple[str, ...]]] = []
    while left:
        best = max(pieces, key=lambda p: (len(pieces[p] & left), len(p)))
        if not pieces[best] & left:  # an anchor without an 8-character stable piece: itself
            out.extend((a, (a,)) for a in sorted(left))
            break
        out.append((best, tuple(sorted(pieces[best] & left))))
        left -= pieces[best]
    return out


def _trie(words: Sequence[str]) -> str:
    root: dict[str, dict] = {}  # type: ignore[type-arg]
    for w in words:
        node = root
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict) -> str:  # type: ignore[type-arg]
        if "" in node:  # a shorter key is a prefix of this one: the prefix already marks the line
            return ""
        alts = [re.escape(ch) + emit(node[ch]) for ch in sorted(node)]
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    return emit(root)


class Prefilter:
    """The anchors' keys as one pattern; ``hits`` yields where anchors are, one look per line."""

    def __init__(self, anchors: Sequence[str]) -> None:
        self.anchors = tuple(anchors)
        spans = [_key_span(a) for a in self.anchors]
        key = [a[sp[0]: sp[1]] if sp else "" for a, sp in zip(self.anchors, spans)]
        # identifiers and titles are written in capitals too (CUBLAS_STATUS_NOT_SUPPORTED, Unhandled FakeTensor
        # Device Propagation): each key also in upper case and in the anchor's title case
        forms = {f[sp[0]: sp[1]] for a, sp in zip(self.anchors, spans) if sp for f in (a, a.upper(), a.title())}
        self.rx = re.compile(_trie(sorted(forms)))
        index = {a: i for i, a in enumerate(self.anchors)}
        self.plain = [(piece, tuple(index[a] for a in of))
                      for piece, of in _plain_keys([a for a, k in zip(self.anchors, key) if not k])]
        # what the pattern matches is the shortest key at a place: it stands for every key it begins
        self.by_match: dict[str, tuple[int, ...]] = {}
        for k in set(key) - {""}:
            self.by_match[k] = tuple(i for i, other in enumerate(key) if other.startswith(k))

    def hits(self, text: str, start: int, cut: int) -> Iterator[tuple[int, int]]:
        """``(position, anchor index)`` of every anchor in ``text[start:cut]``, first occurrence per line."""
        exact = len(text) < EXACT_BELOW
        source = text.lower() if exact else text  # _FOLD keeps lower() length-preserving
        search = self.rx.search
        pos = start
        while pos < cut:
            m = search(source, pos, cut)
            if m is None:
                break
            p = m.start()
            ls, le = self._line(text, start, cut, p)
            which = set(self.by_match.get(m.group().lower(), ()))
            q = p + 1
            while q < le:  # other keys further along the same line (keys may overlap)
                m = search(source, q, le)
                if m is None:
                    break
                which.update(self.by_match.get(m.group().lower(), ()))
                q = m.start() + 1
            yield from self._check(text, source, exact, ls, le, which)
            pos = le + 1
        for piece, which_plain in self.plain:
            p = source.find(piece, start, cut)
            while p != -1:
                ls, le = self._line(text, start, cut, p)
                yield from self._check(text, source, exact, ls, le, which_plain)
                p = source.find(piece, le + 1, cut)

    @staticmethod
    def _line(text: str, start: int, cut: int, p: int) -> tuple[int, int]:
        nl = text.rfind("\n", max(start, p - _BACK), p)
        ls = nl + 1 if nl != -1 else max(start, p - _BACK)
        le = text.find("\n", p, p + 2000)
        return ls, min(cut, p + 2000 if le == -1 else le)

    def _check(self, text: str, source: str, exact: bool, ls: int, le: int,
               which: Iterable[int]) -> Iterator[tuple[int, int]]:
        segment = source[ls:le] if exact else text[ls:le].lower()
        for i in sorted(which):
            f = segment.find(self.anchors[i])
            if f != -1:
                yield ls + f, i
