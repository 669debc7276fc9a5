"""No verb writes over a file it reads.

Before a verb runs, every file it would write (``--html``, ``--file``, and standard output or error when they are
redirected to a file) is compared with every file it reads (checkpoints and the folders scanned, a TARGET's
source file or module, the script ``run`` / ``trace`` runs, ``explain FILE``, ``env --facts``, the
``pyproject.toml`` the options came from). The same file is the same inode, so symbolic links, hard links and
``..`` in a path cannot hide it. A match is one line and exit 2, before anything is opened for writing.

Torch-free and cheap (a few ``stat`` calls): it runs before a checkpoint scan too.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Iterator

from torchdoctor._cli.common import UsageError

class StreamClash(UsageError):
    """Standard output or error is redirected to an input: the line must not be written to that stream."""

    def __init__(self, message: str, fds: frozenset[int]) -> None:
        super().__init__(message)
        self.fds = fds


# Output files a scanned folder may hold without being read as weights: the maps torchdoctor writes there.
_OWN_OUTPUTS = (".html", ".htm")


def module_file(name: str) -> list[str]:
    """The files ``import NAME`` / ``python -m NAME`` would read for a dotted module name, found on ``sys.path``
    without importing anything (a package's ``__init__.py`` and ``__main__.py``)."""
    parts = name.split(".")
    if not all(p.isidentifier() for p in parts):
        return []
    for entry in sys.path:
        base = os.path.join(entry or os.getcwd(), *parts)
        if os.path.isfile(base + ".py"):
            return [base + ".py"]
        if os.path.isdir(base):
            found = [os.path.join(base, f) for f in ("__init__.py", "__main__.py")]
            found = [f for f in found if os.path.isfile(f)]
            if found:
                return found
    return []


def target_files(spec: str) -> list[str]:
    """What a TARGET reads: the file or folder itself, or the source of ``file.py:name`` / ``module:name``."""
    if os.path.exists(spec):
        return [spec]
    if ":" not in spec:
        return []
    where = spec.rsplit(":", 1)[0]
    if where.endswith(".py") or os.sep in where or "/" in where:
        return [where] if os.path.isfile(where) else []
    return module_file(where)


def _inputs(args: argparse.Namespace) -> Iterator[str]:
    verb = args.verb
    if verb in ("scan", "simulate"):
        for spec in args.target or []:
            yield from target_files(spec)
        from torchdoctor._cli.config import find_pyproject

        found = find_pyproject()
        if found:
            yield found
    elif verb == "trace":
        yield args.script
    elif verb == "run":
        if getattr(args, "module", None):
            yield from module_file(args.module[0])
        else:
            program = [p for p in (args.program or []) if p != "--"][:1]
            for script in program:
                yield script
                if os.path.isdir(script):
                    yield os.path.join(script, "__main__.py")
    elif verb == "explain" and args.file not in (None, "-"):
        yield args.file
    elif verb == "env" and getattr(args, "facts", None):
        yield args.facts


def _outputs(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    for option, attr in (("--html", "html"), ("--file", "file")):
        value = getattr(args, attr, None)
        if value and not (args.verb == "explain" and attr == "file"):  # explain's FILE is its input
            yield option, value


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _inside(path: str, folder: str) -> bool:
    """An existing file somewhere below ``folder`` (which a folder scan may read)."""
    if not os.path.isfile(path) or path.lower().endswith(_OWN_OUTPUTS):
        return False
    real, top = os.path.realpath(path), os.path.realpath(folder)
    return real.startswith(top.rstrip(os.sep) + os.sep)


def _stream_file(fd: int) -> os.stat_result | None:
    try:
        st = os.fstat(fd)
    except (OSError, ValueError):
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def refuse_overwrites(args: argparse.Namespace) -> None:
    """Raise :class:`UsageError` when an output of this command line is one of its inputs (see the module's
    docstring); nothing has been written yet when it does."""
    inputs = [p for p in dict.fromkeys(_inputs(args)) if p and os.path.exists(p)]
    if not inputs:
        return
    for option, out in _outputs(args):
        for src in inputs:
            if _same(out, src):
                how = "" if os.path.abspath(out) == os.path.abspath(src) else " (the same file)"
                raise UsageError(f"{option} {out} would overwrite {src}{how}, which this command reads: write it to "
                                 "another path; nothing was written")
            if os.path.isdir(src) and _inside(out, src):
                raise UsageError(f"{option} {out} is inside {src}, which this command reads: write it to another "
                                 "path; nothing was written")
    clashes: dict[int, str] = {}
    for fd, name in ((1, "standard output"), (2, "standard error")):
        st = _stream_file(fd)
        for src in inputs if st is not None else []:
            try:
                other = os.stat(src)
            except OSError:
                continue
            if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):  # type: ignore[union-attr]
                clashes[fd] = f"{name} is redirected to {src}"
                break
    if clashes:
        raise StreamClash(" and ".join(clashes.values()) + ", which this command reads: redirect it to another "
                          "file; nothing was written", frozenset(clashes))
