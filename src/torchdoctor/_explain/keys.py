"""Each signature anchor's key for the prefilter's passes, and the passes' trie-shaped patterns.

A key is a short piece of an anchor that real texts never re-capitalise and that starts with (or, through a
look-behind, holds) one of a few pass characters (``_PASSES``); the keys of one pass character make one pattern
(``_trie``) that starts with that literal character. An anchor without a key is found by its plain pieces
(``_plain_keys``). ``prefilter`` runs the passes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

__all__ = ["key_of"]

# Words real texts write in capitals anywhere (CUDA, CPU, BFloat16, PyTorch, FakeTensor, Python's False and None,
# which rich also colours: "returns \x1b[1;36mFalse") ...: never part of a key.
_CASED = re.compile(r"(?<![a-z])(?:cuda|cpu|xpu|mps|gpu|hpu|npu|nvidia|float|half|double|long|bool|int\d|bfloat|"
                    r"bf16|fp16|fp8|flash|torch|pytorch|python|macos|c\+\+|faketensor|params|int8params|xformers|"
                    r"cublas|ipex|intel|apple|metal|(?:false|none)(?![a-z]))")
# Each pass is one regular expression that starts with one literal character: Python's ``re`` then skips to the
# next occurrence of that character in a C loop, where a pattern that starts with a character class costs about 7 ns
# a character. So every key starts with (or holds) one of a few characters. A pass costs about the same whatever its
# character (reading the text, ~0.8 ns a character, outweighs ~30 ns at each occurrence), so the set is the fewest
# whose keys cover every anchor: "t", "l" and "f" every anchor's lower-case form, "_" the forms written in capitals
# (CUBLAS_STATUS_NOT_SUPPORTED, CUDA_R_16BF: no lower-case character left). Four passes replaced six ("t v b _ u"
# and a plain search for "/ops/fmha"): a sixth less time on a typical app log, the same lines marked.
_PASSES = "tlf_"
_RAREST = "f_lt"
_MIN, _MIN_INSIDE, _MIN_BEHIND, _MAX = 8, 6, 5, 14
_BACK = 96  # an anchor starts at most this far before its key
# Characters a key never contains: terminal colours in logs sit next to them (rich highlights brackets, quotes,
# ``name=`` and numbers; loggers colour whole lines or level names), so a key stays whole between escape sequences
# and a log needs no colour removal before the passes (see ``strip``).
_KEY_BREAK = frozenset("()[]{}'\"`<>=")
# A number standing alone ("16/32-bit floats") is coloured by rich as a whole: a key never spans one either.
_NUMBER = re.compile(r"(?<![a-z_])\d+(?:\.\d+)?")
# The first letter of a message is capitalised, also after "Error: " inside an anchor.
_SENTENCE = re.compile(r"(?:^|[:.!?] )([a-z])")


def _stable(anchor: str) -> list[bool]:
    ok = [True] * len(anchor)
    for m in _SENTENCE.finditer(anchor):  # the first letter of a message is capitalised
        ok[m.start(1)] = False
    ok[0] = False
    for m in _CASED.finditer(anchor):
        ok[m.start(): m.end()] = [False] * (m.end() - m.start())
    for m in _NUMBER.finditer(anchor):
        ok[m.start(): m.end()] = [False] * (m.end() - m.start())
    for i, ch in enumerate(anchor):
        if ch in _KEY_BREAK:
            ok[i] = False
    return ok


def key_of(anchor: str) -> str:
    """The key of one anchor: the longest case-stable piece of it that starts with a pass character; else a
    piece that holds one (found from that character, its start checked by a look-behind); "" when it has
    neither (the anchor is then found by a plain search). A key inside a word may be shorter (``_MIN_INSIDE``)
    than one that starts a word (``_MIN``).

    >>> key_of("expected all tensors to be on the same device")
    'ted all tensor'
    >>> key_of("and weight type (")
    't type '
    >>> key_of("undefined symbol")
    'fined symbol'
    >>> key_of("xformers/ops/fmha")
    '/ops/fmha'
    """
    span = _key_span(anchor, _stable(anchor))
    return anchor[span[0]: span[1]] if span else ""


def _key_span(form: str, ok: list[bool]) -> tuple[int, int, int] | None:
    """``(start, end, where the pass character is)`` of the key of one form of an anchor."""
    best: tuple[tuple[bool, int], tuple[int, int, int]] | None = None
    for i, ch in enumerate(form[:_BACK]):
        if not ok[i] or ch not in _PASSES:
            continue
        j = i
        while j < len(form) and ok[j] and j - i < _MAX:
            j += 1
        # a key that starts inside a word first: real texts capitalise words at will ("Float8 Types is not ..."),
        # and a piece of a word is rarer in logs than a whole common word, so it may be shorter
        inside = i > 0 and form[i - 1].isalpha()
        score = (inside, j - i)
        if j - i >= (_MIN_INSIDE if inside else _MIN) and (best is None or score > best[0]):
            best = (score, (i, j, i))
    if best:
        return best[1]
    for ch in _RAREST:  # no key starts with a pass character: one that holds the rarest of them
        at = form.find(ch)
        while 0 <= at < _BACK:
            i = j = at
            while i > 0 and ok[i - 1] and at - i < _MAX // 2:
                i -= 1
            while j < len(form) and ok[j] and j - i < _MAX:
                j += 1
            if ok[at] and j - i >= _MIN_BEHIND and j - at > 2:  # a look-behind tried after two more characters
                return i, j, at
            at = form.find(ch, at + 1)
    return None


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
    while left and pieces:
        best = max(pieces, key=lambda p: (len(pieces[p] & left), len(p)))
        if not pieces[best] & left:
            break
        out.append((best, tuple(sorted(pieces[best] & left))))
        left -= pieces[best]
    out.extend((a, (a,)) for a in sorted(left))  # an anchor without an 8-character stable piece: itself
    return out


def _trie(items: Sequence[tuple[str, str]]) -> str:
    """One pattern for ``(rest, key)`` items: the text after the pass character, then, for a key that starts
    before it, a look-behind for the whole key."""
    root: dict[str, Any] = {}
    for rest, key in items:
        node = root
        for ch in rest:
            node = node.setdefault(ch, {})
        node.setdefault("", set()).add(key)

    def emit(node: dict[str, Any], done: str) -> str:
        ends: set[str] = node.get("", set())
        if any(len(k) == len(done) + 1 for k in ends):  # a key ends here whole: it already marks the line
            return ""
        alts = [f"(?<={re.escape(k)})" for k in sorted(ends)]
        alts += [re.escape(ch) + emit(node[ch], done + ch) for ch in sorted(node) if ch]
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    return emit(root, "")
