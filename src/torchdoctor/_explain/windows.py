"""What a signature's patterns find in the window around a hit, remembered by the window's shape.

A log of errors repeats its messages with other numbers in them: line numbers of the frame before a message, shapes,
addresses, and a time stamp on every line. A pattern that treats every ASCII digit alike (each of its atoms matches
all ten or none, no back-reference: ``uniform``) behaves the same, position for position, on two texts that differ
only in which digits they hold: the same places match and the same groups span the same places. So where every
pattern of a signature is uniform, what they found is remembered by the squeezed window with its digits as 0, as
the places of the groups, and each window's fields are read from its own text at those places: exact, whatever the
digits were.
"""

from __future__ import annotations

import re
from typing import Any

try:  # the parser of ``re`` (its module moved in Python 3.11)
    import re._parser as _sre_parse  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre_parse  # type: ignore[no-redef]

from torchdoctor._explain.signatures import Signature

__all__ = ["DIGITS", "Shapes", "find_fields", "own_trace", "squeeze", "uniform"]

# a quoted reply's prefix after a line end: only then is _WRAP needed (it drops the "> " / "| " prefixes); without
# one, splitting on whitespace gives the same squeezed window at a fifth of the cost (_WRAP starts with a
# character class, which ``re`` tries at every position: it was a sixth of explain's time on a log of errors)
_WRAP = re.compile(r"[ \t]*(?:\r?\n[ \t>|]*)+[ \t]*|[ \t]{2,}")
_QUOTED = re.compile(r"\n[ \t]*[>|]")
# digits as 0 over the UTF-8 bytes: a C table look-up per byte (``str.translate`` was a third of a window's cost);
# no other character's bytes are ASCII digits, so the shape is exact
DIGITS = _DIGITS = bytes.maketrans(b"123456789", b"000000000")
_TEN = frozenset(range(48, 58))
# classes that match every ASCII digit (the rest of the categories match none)
_ALL_DIGITS = frozenset({"CATEGORY_DIGIT", "CATEGORY_WORD", "CATEGORY_NOT_SPACE", "CATEGORY_UNI_DIGIT",
                         "CATEGORY_UNI_WORD", "CATEGORY_UNI_NOT_SPACE"})
_NO_DIGITS = frozenset({"CATEGORY_NOT_DIGIT", "CATEGORY_NOT_WORD", "CATEGORY_SPACE", "CATEGORY_UNI_NOT_DIGIT",
                        "CATEGORY_UNI_NOT_WORD", "CATEGORY_UNI_SPACE"})
_UNIFORM: dict[str, bool] = {}
_TRY = 512  # windows looked up by shape before the memo must have served a quarter of them


class Shapes:
    """Per text read: shape -> (whether a pattern matched, (group, start, end) of each field in the order they were
    taken). A log whose numbers differ in length from line to line makes few shapes twice; where the memo serves
    fewer than a quarter of its look-ups it is left off for the rest of the text (a look-up that misses costs more
    than reading the window)."""

    def __init__(self) -> None:
        self.memo: dict[tuple[str, bytes], tuple[bool, tuple[tuple[str, int, int], ...]]] = {}
        self.tried = self.missed = 0
        self.on = True

    def __len__(self) -> int:
        return len(self.memo)


def squeeze(window: str) -> str:
    r"""``window`` with its line ends and runs of blanks as single spaces, a quoted reply's prefixes dropped.

    >>> squeeze("Input type (float)\n  > and bias type   (c10::Half)")
    'Input type (float) and bias type (c10::Half)'
    """
    if _QUOTED.search(window):
        return _WRAP.sub(" ", window)
    return " ".join(window.split())


def _same_digits(items: Any) -> bool:
    """Whether every atom of a parsed pattern matches all ten ASCII digits or none of them (anything unknown:
    no)."""
    for op, av in items:
        name = str(op)
        if name in ("LITERAL", "NOT_LITERAL"):
            if av in _TEN:
                return False
        elif name == "IN":
            held: set[int] = set()
            for op2, av2 in av:
                name2 = str(op2)
                if name2 == "LITERAL":
                    held.update({av2} & _TEN)
                elif name2 == "RANGE":
                    held.update(set(range(av2[0], av2[1] + 1)) & _TEN)
                elif name2 == "CATEGORY":
                    if str(av2) in _ALL_DIGITS:
                        held.update(_TEN)
                    elif str(av2) not in _NO_DIGITS:
                        return False
                elif name2 != "NEGATE":
                    return False
            if held and held != _TEN:
                return False
        elif name == "SUBPATTERN":
            if not _same_digits(av[-1]):
                return False
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            if not _same_digits(av[2]):
                return False
        elif name == "BRANCH":
            if not all(_same_digits(b) for b in av[1]):
                return False
        elif name in ("ASSERT", "ASSERT_NOT"):
            if not _same_digits(av[1]):
                return False
        elif name == "ATOMIC_GROUP":
            if not _same_digits(av):
                return False
        elif name == "CATEGORY":
            if str(av) not in _ALL_DIGITS and str(av) not in _NO_DIGITS:
                return False
        elif name not in ("ANY", "AT"):  # a back-reference compares digits; anything else is not known here
            return False
    return True


def uniform(sig: Signature) -> bool:
    """Whether every pattern of ``sig`` treats all ASCII digits alike (see the module's doc)."""
    got = _UNIFORM.get(sig.name)
    if got is None:
        got = _UNIFORM[sig.name] = all(_same_digits(_sre_parse.parse(rx.pattern, rx.flags)) for rx in sig.compiled())
    return got


def _literal(rx: re.Pattern[str]) -> tuple[str, int]:
    """The first run of four or more ASCII literal characters at the top of ``rx`` (lower case) that every match
    holds, and how far after a match's start it begins at most (-1: no bound); ``("", -1)`` where there is none."""
    items = _sre_parse.parse(rx.pattern, rx.flags)
    back, i = 0, 0
    while i < len(items):
        j = i
        while j < len(items) and str(items[j][0]) == "LITERAL":
            j += 1
        run = "".join(chr(av) for _, av in items[i:j])
        if len(run) >= 4 and run.isascii():
            return run.lower(), back
        if j > i:
            back += len(run)
            i = j
            continue
        high = _sre_parse.SubPattern(items.state, [items[i]]).getwidth()[1]
        back = -1 if back == -1 or high >= _sre_parse.MAXREPEAT else back + high
        i += 1
    return "", -1


def _search(rx: re.Pattern[str], text: str, low: str | None) -> re.Match[str] | None:
    """``rx.search(text)``, started where a match can begin: a match holds the pattern's literal (``_literal``) at
    most ``back`` characters after its start, so none starts before the literal's first place less ``back``, and
    none at all where the literal is absent. Read on ``low``, the window lower-cased, only for an ASCII window: there
    ``re.IGNORECASE`` matches an ASCII letter as its two cases only. ``re`` itself tries every place of a pattern
    that starts with a class or a cased letter (every signature's pattern ignores case): a few of them cost most of
    the windows' time in a log of errors."""
    plan = _PLANS.get(rx)
    if plan is None:
        plan = _PLANS[rx] = _literal(rx)
    if low is None or not plan[0]:
        return rx.search(text)
    at = low.find(plan[0])
    if at == -1:
        return None
    back = plan[1]
    return rx.search(text, at - back if 0 <= back < at else 0)


_PLANS: dict[re.Pattern[str], tuple[str, int]] = {}


def find_fields(squeezed: str, sig: Signature, shapes: Shapes | None) -> tuple[dict[str, str], bool]:
    """The fields the patterns of ``sig`` find in the squeezed window (a group's first non-empty value, patterns in
    order) and whether one matched; remembered in ``shapes`` by the window's shape where ``sig`` is ``uniform``."""
    if shapes is not None and shapes.on and uniform(sig):
        shape = (sig.name, squeezed.encode("utf-8", "surrogatepass").translate(_DIGITS))
        shapes.tried += 1
        got = shapes.memo.get(shape)
        if got is None:
            taken: dict[str, tuple[str, int, int]] = {}
            matched = False
            low = squeezed.lower() if squeezed.isascii() else None
            for rx in sig.compiled():
                m = _search(rx, squeezed, low)
                if m:
                    matched = True
                    for k in m.groupdict():
                        a, b = m.span(k)
                        if b > a and k not in taken:
                            taken[k] = (k, a, b)
            if len(shapes.memo) > 8192:
                shapes.memo.clear()
            got = shapes.memo[shape] = (matched, tuple(taken.values()))
            shapes.missed += 1
            if shapes.tried >= _TRY and shapes.missed * 4 > shapes.tried * 3:
                shapes.on = False
        return {k: squeezed[a:b] for k, a, b in got[1]}, got[0]
    found: dict[str, str] = {}
    matched = False
    low = squeezed.lower() if squeezed.isascii() else None
    for rx in sig.compiled():
        m = _search(rx, squeezed, low)
        if m:
            matched = True
            for k, v in m.groupdict().items():
                if v and k not in found:
                    found[k] = v
    return found, matched


_TRACE = "traceback (most recent call last)"
_SAID = re.compile(r"(\w{0,40}(?:error|exception)\w{0,20}:) (.{24,})")


def own_trace(message: str, trail: str) -> int:
    r"""Where, in ``trail`` (the lower-cased lines after an error line), the stops that end the error's context are
    looked for: past ComfyUI's "!!! Exception during processing !!!" header, whose traceback follows it; past a
    traceback (the first after it) that ends in the same words as ``message`` (the message as a title or summary line
    above the paste), whose frames are this error's; else from the start.

    >>> title = "NotImplementedError: Could not run 'aten::empty' with arguments from the 'CUDA' backend"
    >>> own_trace(title, "\n```\ntraceback (most recent call last):\n  file x\n" + title.lower() + ". this")
    49
    >>> own_trace(title, "\ntraceback (most recent call last):\n  file x\nvalueerror: another")
    0
    """
    low = message.lower()
    if "exception during processing" in low:
        return trail.find("\n", 1) + 1
    at = trail.find(_TRACE)
    said = _SAID.search(low.split("\n", 1)[0])  # the exception's name and the message's own words after it
    if at == -1 or said is None:
        return 0
    name, head = said.group(1) + " ", said.group(2)[:120]
    nxt = trail.find(_TRACE, at + len(_TRACE))  # the message must end this traceback, not a later one
    again = trail.find(name + head, at + len(_TRACE), nxt if nxt != -1 else len(trail))
    between = trail[at + len(_TRACE): again]  # up to the repeated exception's name
    if again == -1 or "error: " in between or "\n\n" in between.replace(" ", "").replace("\t", ""):
        return 0  # another error, or a blank line, ends a traceback: the same words later are another report
    return again
