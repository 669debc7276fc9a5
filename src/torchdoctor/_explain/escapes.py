"""Error texts that arrive escaped: read as the plain text torch printed (issue 41, point 7).

People paste what their tool shows them, not what torch printed: ComfyUI's API and its error reports carry the
message and the traceback as JSON strings (``\\"addmm_impl_cpu_\\" not implemented for \\u0027Half\\u0027``, frames
joined with ``\\n``), a web page or a web UI's error box is copied as HTML (``&quot;``, ``&#39;``, ``&lt;``), and a
logged ``repr`` of an exception escapes its quotes (``\\'Half\\'``). The anchors and patterns are written for the
plain text, so the escapes are undone before they are read, in linear time: a paste whole (``scanner.normalise``),
a log only where it is examined (the lines the prefilter marks, the windows and context the scanner reads).

JSON escapes are undone only on the lines that show a JSON (or ``repr``) escape: an escaped quote or a ``\\uXXXX``.
A plain Windows log is full of backslashes (``D:\\ComfyUI\\nodes.py``), and reading ``\\n`` there as a line end would
cut its paths in two; a line that escapes its quotes is a string literal, where ``\\\\`` is one backslash and
``\\n`` a line end.

>>> unescape('{"exception_message": "\\\\"addmm_impl_cpu_\\\\" not implemented for \\\\u0027Half\\\\u0027"}')
'{"exception_message": ""addmm_impl_cpu_" not implemented for \\'Half\\'"}'
>>> unescape("RuntimeError: &quot;addmm_impl_cpu_&quot; not implemented for &#39;Half&#39;")
'RuntimeError: "addmm_impl_cpu_" not implemented for \\'Half\\''
>>> unescape('  File "D:\\\\ComfyUI\\\\nodes.py", line 1373')  # a plain Windows frame: left as it is
'  File "D:\\\\ComfyUI\\\\nodes.py", line 1373'
"""

from __future__ import annotations

import re

__all__ = ["unescape"]

# Entities a browser or an HTML export writes for the characters error texts hold; "&amp;" last, so that a text
# escaped twice ("&amp;quot;") comes back as it was typed once, not decoded twice.
_HTML = (("&quot;", '"'), ("&apos;", "'"), ("&lt;", "<"), ("&gt;", ">"), ("&nbsp;", " "), ("&amp;", "&"))
_NUMERIC = re.compile(r"&#(?:([0-9]{1,7})|[xX]([0-9a-fA-F]{1,6}));")  # &#39; &#x27; &#40; ...
# What shows that a line is a JSON string or a repr: an escaped quote or a \uXXXX escape (a Windows path has neither).
_SIGNAL = re.compile(r"\\(?:[\"']|u[0-9a-fA-F]{4})")
_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|([\"'\\/bfnrt]))")
_SIMPLE = {'"': '"', "'": "'", "\\": "\\", "/": "/", "b": "", "f": "", "n": "\n", "r": "\n", "t": "\t"}
_ROUNDS = 2  # a JSON string inside a JSON string (an error report posted through an API) is escaped twice


def _one(m: re.Match[str]) -> str:
    code = m.group(1)
    if code is None:
        return _SIMPLE[m.group(2)]
    value = int(code, 16)
    return "?" if 0xD800 <= value <= 0xDFFF else chr(value)  # half a surrogate pair is no character


_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_BY_FIND = 64  # backslashes looked at one by one per search; past that (a Windows log) the regex reads on


def _next_signal(text: str, pos: int) -> int:
    """Where the next escaped quote or ``\\uXXXX`` starts, or -1. A backslash is found by ``str.find`` (a fast
    scan, where a regex tries every character: the regex alone cost a tenth of a log's time); a text with many
    backslashes that are no escapes (Windows paths) goes on with the regex."""
    for _ in range(_BY_FIND):
        p = text.find("\\", pos)
        if p == -1:
            return -1
        nxt = text[p + 1: p + 2]
        if nxt == '"' or nxt == "'" or (nxt == "u" and _HEX4.match(text, p + 2)):
            return p
        pos = p + 1
    m = _SIGNAL.search(text, pos)
    return m.start() if m else -1


def _json_lines(text: str) -> str:
    """The lines of ``text`` that show a JSON / repr escape, with their escapes undone; the rest as they were."""
    parts: list[str] = []
    done = 0
    pos = 0
    while True:
        at = _next_signal(text, pos)
        if at == -1:
            break
        start = text.rfind("\n", 0, at) + 1
        end = text.find("\n", at + 2)
        end = len(text) if end == -1 else end
        line = text[start:end]
        for _ in range(_ROUNDS):
            line = _ESCAPE.sub(_one, line)
            if not _SIGNAL.search(line):
                break
        parts.append(text[done:start])
        parts.append(line)
        done = pos = end
    if not parts:
        return text
    parts.append(text[done:])
    return "".join(parts)


def _char(m: re.Match[str]) -> str:
    value = int(m.group(1)) if m.group(1) else int(m.group(2), 16)
    if value == 0xA0:
        return " "
    return chr(value) if 0 < value <= 0x10FFFF and not 0xD800 <= value <= 0xDFFF else "?"


def unescape(text: str) -> str:
    """``text`` with HTML entities and, on the lines that are JSON strings or reprs, JSON escapes undone."""
    if "&" in text:
        if "&#" in text:
            text = _NUMERIC.sub(_char, text)
        if "&quot;" in text or "&lt;" in text or "&gt;" in text or "&apos;" in text or "&amp;" in text \
                or "&nbsp;" in text:
            for entity, char in _HTML:
                if entity in text:
                    text = text.replace(entity, char)
    if "\\" in text:
        text = _json_lines(text)
    return text
