"""The command line's habits: "did you mean" for a misspelt verb or option, and ``torchdoctor help [VERB]``.

Only a usage error or ``help`` loads this module, so a correct command line pays nothing for it.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")
_UNKNOWN = re.compile(r"unrecognized arguments: (.*)")


def _close(word: str, candidates: list[str]) -> str | None:
    import difflib

    found = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return found[0] if found else None


def _options(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string of ``parser`` and of the verb parsers it holds (those built for this command line)."""
    out: list[str] = []
    for action in parser._actions:
        out.extend(s for s in action.option_strings if s.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out.extend(_options(sub))
    return list(dict.fromkeys(out))


def with_hint(parser: argparse.ArgumentParser, message: str) -> str:
    """``message`` with "; did you mean ...?" when a verb, a choice or an option is a near miss
    (``scna`` -> ``scan``, ``--devcie`` -> ``--device``, ``--colour`` -> ``--color``)."""
    m = _CHOICE.search(message)
    if m:
        choices = [c.strip().strip("'") for c in m.group(2).split(",")]
        near = _close(m.group(1), choices)
        return f"{message}; did you mean {near!r}?" if near else message
    m = _UNKNOWN.search(message)
    if m:
        hints = []
        options = _options(parser)
        for word in m.group(1).split():
            if word.startswith("--"):
                near = _close(word.split("=", 1)[0], options)
                if near:
                    hints.append((word, near))
        if len(hints) == 1:
            return f"{message}; did you mean {hints[0][1]}?"
        if hints:
            return f"{message}; did you mean {', '.join(f'{near} for {word}' for word, near in hints)}?"
    return message


def help_command(words: list[str], verbs: list[str], parse: Any) -> int:
    """``torchdoctor help`` (the verbs) and ``torchdoctor help VERB`` (that verb's ``--help``); ``parse`` is the
    command line's own parse function, so the text is the one ``--help`` prints."""
    import sys

    if len(words) < 2:
        return int(parse(["--help"]))
    verb = words[1]
    if verb not in verbs:
        near = _close(verb, verbs)
        hint = f"; did you mean {near!r}?" if near else ""
        print(f"torchdoctor help: no verb {verb!r} (verbs: {', '.join(verbs)}){hint}", file=sys.stderr)
        return 2
    return int(parse([verb, "--help"]))
