"""Prose typed around a pasted error: a word found only there ("I fine-tune with qlora") is what the user believes,
not what ran, and ``context.rank`` weighs it half."""

from __future__ import annotations

import re

from torchdoctor._explain.tokens import find_word

__all__ = ["LINES", "forget", "prose_only", "said"]

# A line of prose: a sentence someone typed around a paste. It starts with a letter or digit, holds at least three
# spaces, and none of the characters that frames, code, paths, log records and messages carry.
_PROSE = re.compile(r"[^\W_][^/_=()\[\]{}<>\"|%#@$*+~&`\t]{0,2000}")
_LOG_HEAD = re.compile(r"\w{1,40}:|.{0,200}\d:\d")  # "WARNING:", "ValueError:", a time stamp: a program wrote it
# a label a person types ("Title: ...", "Update: ..."), and a parenthesis opened after a space, not a call
_LABEL = re.compile(r"(?:title|subject|summary|description|question|problem|issue|context|note|update|edit): ")
_ASIDE = re.compile(r"(?<= )\(|\)|\+")
# Where an error starts on a line typed as "Using qlora on my mac, then: RuntimeError: ..." (lower-cased text)
_HEAD = re.compile(r"(?<![\w.])\w{0,40}(?:error|exception)(?::|\b)")


# What each line of a text's contexts was found to be (``prose_only``'s ``lines``), for all its diagnoses: a log of
# errors puts one traceback's lines in the contexts of the errors around it too (a line is read ~4 times there)
LINES: dict[str, tuple[int, bool | None]] = {}


def forget() -> None:
    """Start a new text: nothing found in the last one is reused (a run's speed is that text's own)."""
    LINES.clear()


def _is_prose(line: str) -> bool:
    return line.count(" ") >= 3 and bool(_PROSE.fullmatch(_ASIDE.sub("", line))) and (
        not _LOG_HEAD.match(line) or bool(_LABEL.match(line)))


def _lead(line: str) -> int:
    """The length of the prose typed before the error on the error's own line, else 0."""
    m = _HEAD.search(line, 0, 2000)
    return m.start() if m and m.start() and _is_prose(line[:m.start()].rstrip(" :`'\"(")) else 0


def said(message: str) -> str:
    """The error's own message without the prose typed before it on its first line."""
    return message[_lead(message.split("\n", 1)[0]):]


def prose_only(context: str, word: str, own: str, lines: dict[str, tuple[int, bool | None]] | None = None) -> bool:
    """Whether every occurrence of ``word`` in ``context`` (the first 16) sits on a line of prose, and the error's
    own message (``own``: what ``said`` gives) does not hold it: "I fine-tune with qlora" is what the user believes, a frame
    in bitsandbytes is what ran. Prose typed on the error's own line, before it, is prose too. ``lines`` keeps
    what a line was found to be for the other words of one diagnosis."""
    if not word or find_word(own, word) != -1:
        return False
    if lines is None:
        lines = {}
    p = find_word(context, word)
    for _ in range(16):
        if p == -1:
            return True
        start = context.rfind("\n", 0, p) + 1
        end = context.find("\n", p)
        line = context[start: end if end != -1 else len(context)].rstrip()
        known = lines.get(line)
        if known is None:
            known = lines[line] = (_lead(line), None)
        if not p - start < known[0]:
            if known[1] is None:
                known = lines[line] = (known[0], _is_prose(line))
            if not known[1]:
                return False
        p = find_word(context, word, end) if end != -1 else -1
    return False
