"""A fix printed as a patch: one line of the user's file replaced, written as a unified diff that ``git apply`` and
``patch -p1`` take as is.

The file is read, never written. The path in the diff is relative to the git work tree the file is in (found by
looking for ``.git`` upward, so no ``git`` process is started), else relative to the current directory when the
file lies under it (an app's root, where the user ran the command), else the file's bare name, with the ``a/`` and ``b/``
prefixes both tools expect. The replaced line keeps its line ending, and its indentation when the new text has none,
so a fix written as ``x = x.to(torch.float16)`` lands at the depth of the line it replaces.

>>> import pathlib, tempfile
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> _ = (folder / "model.py").write_text("def f(x):\\n    return x.float()\\n")
>>> print(line_patch(str(folder / "model.py"), 2, "return x.half()"), end="")
--- a/model.py
+++ b/model.py
@@ -1,2 +1,2 @@
 def f(x):
-    return x.float()
+    return x.half()
>>> line_patch(str(folder / "model.py"), 3, "pass") is None
True
"""

from __future__ import annotations

import os

CONTEXT = 3  # lines kept either side, as diff -u writes them; enough for patch to find a moved line
_NO_EOL = "\\ No newline at end of file\n"


def repo_path(path: str) -> str:
    """``path`` relative to the git work tree holding it (``/`` separated), else to the current directory when it
    lies under it (``git apply`` and ``patch -p1`` run there), else the file's bare name."""
    full = os.path.realpath(path)
    folder = os.path.dirname(full)
    while True:
        if os.path.exists(os.path.join(folder, ".git")):  # a folder, or a file in a worktree or submodule
            return os.path.relpath(full, folder).replace(os.sep, "/")
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    try:
        here = os.path.realpath(os.getcwd())
    except OSError:  # the current directory was removed
        return os.path.basename(full)
    if full.startswith(here.rstrip(os.sep) + os.sep):
        return os.path.relpath(full, here).replace(os.sep, "/")
    return os.path.basename(full)


def _read_lines(path: str) -> list[str] | None:
    """The file's lines with their endings, or None when it is not a readable UTF-8 text file."""
    try:
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    if b"\0" in data:  # binary: a diff of it would not apply
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    # split on "\n" only: str.splitlines would also split on form feeds and other breaks that patch keeps in a line
    return _split_keep(text)


def _split_keep(text: str) -> list[str]:
    lines = text.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])  # a last line without a newline
    return out


def _ending(line: str) -> str:
    if line.endswith("\r\n"):
        return "\r\n"
    return "\n" if line.endswith("\n") else ""


def _new_lines(old: str, new_line: str) -> list[str]:
    """``new_line`` (one or more lines) as the file would hold it in place of ``old``."""
    ending = _ending(old)
    body = old[: len(old) - len(ending)]
    indent = body[: len(body) - len(body.lstrip(" \t"))]
    parts = new_line.rstrip("\r\n").replace("\r\n", "\n").split("\n")
    if parts[0] == parts[0].lstrip(" \t"):  # no indentation given: the replaced line's, for every line
        parts = [indent + p if p.strip() else p for p in parts]
    # every new line ends as the file's lines do; the last one as the replaced line did (maybe with no newline)
    sep = "\r\n" if ending == "\r\n" else "\n"
    return [p + sep for p in parts[:-1]] + [parts[-1] + ending]


def _emit(prefix: str, line: str) -> str:
    return prefix + line if line.endswith("\n") else prefix + line + "\n" + _NO_EOL


def line_patch(path: str, lineno: int, new_line: str) -> str | None:
    """A unified diff of ``path`` with line ``lineno`` (1-based) replaced by ``new_line``; None when the file is not a
    readable text file, the line does not exist, or the replacement would change nothing."""
    lines = _read_lines(path)
    if lines is None or not isinstance(lineno, int) or not 1 <= lineno <= len(lines):
        return None
    old = lines[lineno - 1]
    new = _new_lines(old, new_line)
    if new == [old]:
        return None
    start = max(1, lineno - CONTEXT)
    before = lines[start - 1: lineno - 1]
    after = lines[lineno: lineno + CONTEXT]
    old_len = len(before) + 1 + len(after)
    new_len = len(before) + len(new) + len(after)
    name = repo_path(path)
    out = [f"--- a/{name}\n", f"+++ b/{name}\n", f"@@ -{start},{old_len} +{start},{new_len} @@\n"]
    out += [_emit(" ", line) for line in before]
    out.append(_emit("-", old))
    out += [_emit("+", line) for line in new]
    out += [_emit(" ", line) for line in after]
    return "".join(out)


def move_patch(path: str, lo: int, hi: int, after: int) -> str | None:
    """A unified diff of ``path`` with lines ``lo``..``hi`` (1-based, inclusive) moved to just after line ``after``
    (below them), as they are; None when the file is not a readable text file, the lines do not exist, or a line
    of the hunk has no line ending.

    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "app.py").write_text("a\\nload\\nb\\nmove\\nc\\n")
    >>> print(move_patch(str(folder / "app.py"), 2, 2, 4), end="")
    --- a/app.py
    +++ b/app.py
    @@ -1,5 +1,5 @@
     a
    -load
     b
     move
    +load
     c
    """
    lines = _read_lines(path)
    if lines is None or not 1 <= lo <= hi < after <= len(lines):
        return None
    start, end = max(1, lo - CONTEXT), min(len(lines), after + CONTEXT)
    if not all(x.endswith("\n") for x in lines[start - 1: end]):
        return None
    name, size = repo_path(path), end - start + 1
    out = [f"--- a/{name}\n", f"+++ b/{name}\n", f"@@ -{start},{size} +{start},{size} @@\n"]
    out += [" " + x for x in lines[start - 1: lo - 1]] + ["-" + x for x in lines[lo - 1: hi]]
    out += [" " + x for x in lines[hi: after]] + ["+" + x for x in lines[lo - 1: hi]]
    return "".join(out + [" " + x for x in lines[after: end]])


def merged(diffs: list[str]) -> str | None:
    """The one-line diffs ``line_patch`` writes, of one file or several, as one patch that ``git apply`` takes whole:
    two fixes three lines apart each quote the other's old line as context, so applied one after the other the second
    no longer applies. None when a diff is not of that shape or two change one line differently.

    >>> a = "--- a/m.py\\n+++ b/m.py\\n@@ -1,3 +1,3 @@\\n x\\n-y\\n+Y\\n z\\n"
    >>> b = "--- a/m.py\\n+++ b/m.py\\n@@ -2,2 +2,2 @@\\n y\\n-z\\n+Z\\n"
    >>> print(merged([a, b]), end="")
    --- a/m.py
    +++ b/m.py
    @@ -1,3 +1,3 @@
     x
    -y
    +Y
    -z
    +Z
    """
    files: dict[str, tuple[dict[int, str], dict[int, tuple[str, list[str]]], list[tuple[int, int]]]] = {}
    for diff in diffs:
        lines = diff.splitlines(keepends=True)
        if len(lines) < 4 or not lines[0].startswith("--- a/") or not lines[1].startswith("+++ b/") \
                or _NO_EOL in lines or sum(x.startswith("@@") for x in lines) != 1:
            return None
        try:
            start, length = (int(v) for v in lines[2].split()[1][1:].split(","))
        except ValueError:
            return None
        known, changes, spans = files.setdefault(lines[0][6:].rstrip("\n"), ({}, {}, []))
        spans.append((start, start + length - 1))
        at, removed = start, None
        mine: dict[int, tuple[str, list[str]]] = {}
        for line in lines[3:]:
            kind, text = line[:1], line[1:]
            if kind == " ":
                known[at], at, removed = text, at + 1, None
            elif kind == "-" and removed is None:
                removed, at = at, at + 1
                mine[removed] = (text, [])
            elif kind == "+" and removed is not None:
                mine[removed][1].append(text)
            else:
                return None
        for n, change in mine.items():  # one line changed by two fixes: the same change, else no patch
            if changes.setdefault(n, change) != change:
                return None
    out: list[str] = []
    for name, (known, changes, spans) in files.items():
        out += [f"--- a/{name}\n", f"+++ b/{name}\n"]
        delta = 0
        for lo, hi in _joined(spans):
            body: list[str] = []
            size = 0
            for n in range(lo, hi + 1):
                if n in changes:
                    body += ["-" + changes[n][0], *("+" + x for x in changes[n][1])]
                    size += len(changes[n][1])
                elif n in known:
                    body.append(" " + known[n])
                    size += 1
                else:
                    return None
            out += [f"@@ -{lo},{hi - lo + 1} +{lo + delta},{size} @@\n", *body]
            delta += size - (hi - lo + 1)
    return "".join(out)


def _joined(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Line ranges, overlapping or touching ones joined (one hunk each)."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out
