"""Whether the context rules' words occur in one error's context: each word looked up once, a long context read
through the shape of its distinct lines, and a word skipped where a shorter rule word it holds is absent.

A diagnosis asks about fifty words of its context (``context.rank``), nearly all absent, and each look-up is a
pass over the whole context in C; in an app's log that context is ~11,000 characters of progress bars and time
stamps that differ only in their digits. Three things make the answer cheaper and never different:
- in a context over ``_LONG`` characters, a word without digits, line ends or marked ends (``\\b``) is in the
  context exactly when it is in the context's *shape*: its distinct lines, each with its digits as ``0``, as UTF-8
  bytes (the words are ASCII: a UTF-8 byte below 128 is always that ASCII character; a digit-free word matches a
  line where it matches that line's shape, and a word without a line end lies within one line; a shorter context
  is read as it is, cheaper than making its shape);
- a word that holds a shorter rule word (``bnb_4bit`` holds ``4bit``) is absent where that word is absent, in any
  context (a log of error texts, ~2 KB contexts: one look-up in seven is answered so);
- every answer is kept for the context's diagnosis (``known``).
Words with digits and marked words are looked up in the context itself, as ``find_word`` reads them.
"""

from __future__ import annotations

from collections.abc import Iterable

from torchdoctor._explain.tokens import find_word

__all__ = ["Plan", "Present", "plans"]

_LONG = 4096  # a context longer than this is read through its shape (its lines a few times over, as a log's are)
_SHAPE = bytes.maketrans(b"123456789", b"000000000")
Plan = tuple[str | None, bytes | None, bool]  # a shorter rule word it holds, its bytes for the shape, marked ends
_PLANS: dict[int, tuple[object, dict[str, Plan]]] = {}
_LOOSE: dict[str, Plan] = {}


def _plan(word: str, held: str | None) -> Plan:
    marked = "\\b" in word
    plain = word.isascii() and "\n" not in word and not marked and not any(c.isdigit() for c in word) and word
    return held, word.encode("ascii") if plain else None, marked


def plans(owner: object, words: Iterable[str]) -> dict[str, Plan]:
    """How each of ``words`` is looked up: the shortest other plain word of them it holds (none for a marked word),
    whose absence answers for it; its bytes where the shape answers for it; whether its ends are marked. Made once
    per ``owner`` (a rule table, kept alive with its answer)."""
    got = _PLANS.get(id(owner))
    if got is None or got[0] is not owner:
        words = tuple(words)
        plain = sorted({w for w in words if "\\b" not in w}, key=lambda w: (len(w), w))
        table = {w: _plan(w, None) for w in words}
        for i, w in enumerate(plain):
            table[w] = _plan(w, next((g for g in plain[:i] if len(g) < len(w) and g in w), None))
        if len(_PLANS) > 64:
            _PLANS.clear()
        got = _PLANS[id(owner)] = (owner, table)
    return got[1]


_NONE: frozenset[str] = frozenset()
_NO_HELD: dict[str, str] = {}
_DIRECT: dict[int, tuple[object, frozenset[str], dict[str, str]]] = {}


def _direct(plans: dict[str, Plan]) -> tuple[frozenset[str], dict[str, str]]:
    """The words of ``plans`` with neither a shorter word that holds them nor marked ends, and the word each other
    unmarked one holds (once per table)."""
    got = _DIRECT.get(id(plans))
    if got is None or got[0] is not plans:
        if len(_DIRECT) > 64:
            _DIRECT.clear()
        got = _DIRECT[id(plans)] = (
            plans, frozenset(w for w, (held, _, marked) in plans.items() if held is None and not marked),
            {w: held for w, (held, _, marked) in plans.items() if held is not None and not marked})
    return got[1], got[2]


class Present:
    """``present(word)``: whether a context rule's word occurs in ``context`` as ``find_word`` finds it, for a word
    not asked before; ``first(words)``: the first of a rule's words that occurs. ``known`` holds every answer given
    (read before a call: a dict look-up is cheaper than one)."""

    __slots__ = ("context", "known", "plans", "_shape", "_direct", "_held")

    def __init__(self, context: str, plans: dict[str, Plan]) -> None:
        self.context = context
        self.known: dict[str, bool] = {}
        self.plans = plans
        self._shape: bytes | None = None
        # the words a short context is read for as they are (no shorter word holds them, no marked end)
        self._direct, self._held = _direct(plans) if len(context) <= _LONG else (_NONE, _NO_HELD)

    def first(self, words: tuple[str, ...]) -> str | None:
        """The first of ``words`` the context holds, else None."""
        known, context, direct, holds = self.known, self.context, self._direct, self._held
        for w in words:
            got = known.get(w)
            if got is None:
                if w in direct:
                    got = known[w] = w in context
                else:
                    held = holds.get(w)  # a short context: the word an unmarked word holds, asked first
                    if held is not None:
                        h = known.get(held)
                        if h is None:
                            h = known[held] = held in context if held in direct else self(held)
                        if not h:
                            known[w] = False
                            continue
                    got = self(w)
            if got:
                return w
        return None

    def __call__(self, word: str) -> bool:
        known = self.known
        plan = self.plans.get(word)
        if plan is None:  # a word no rule table plans (an app's word): its plan made once per process
            plan = _LOOSE.get(word)
            if plan is None:
                if len(_LOOSE) > 4096:
                    _LOOSE.clear()
                plan = _LOOSE[word] = _plan(word, None)
        held, form, marked = plan
        if held is not None:
            got = known.get(held)
            if got is None:
                got = self(held)
            if not got:
                known[word] = False
                return False
        context = self.context
        if marked:
            got = find_word(context, word) != -1
        elif form is not None and len(context) > _LONG:
            shape = self._shape
            if shape is None:
                lines = context.encode("utf-8", "surrogatepass").translate(_SHAPE).split(b"\n")
                shape = self._shape = b"\n".join(dict.fromkeys(lines))
            got = form in shape
        else:
            got = word in context
        known[word] = got
        return got
