"""Is a source file the user's own (not an installed library's, not the standard library's, never torchdoctor's)?
Imports nothing of torchdoctor's: a virtual run asks it on every module cast the program makes, before anything has
failed. The install paths are read on the first question, from ``site`` (imported at every start already). torchdoctor's own package folder is never the program's, installed or not: an editable install (a checkout
on ``sys.path``) lies outside site-packages, and its wrappers (a trace's patched ``Module.to``) would otherwise be
"the line that moved the tensor"."""

from __future__ import annotations

import os
import sys

_LIBS: list[str] = []  # the real paths of the install's library folders, filled on the first call
_OURS = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep  # torchdoctor/


def _libs() -> list[str]:
    if not _LIBS:
        import site  # imported at every start already (``sysconfig`` would cost a millisecond more)

        dirs = {os.path.dirname(os.__file__), sys.prefix, getattr(sys, "base_prefix", sys.prefix)}
        try:
            dirs.update(site.getsitepackages())
        except AttributeError:  # an old virtualenv's site module
            pass
        user = getattr(site, "getusersitepackages", lambda: "")()
        if user:
            dirs.add(user)
        _LIBS.extend(os.path.realpath(p) + os.sep for p in dirs if p)
        _LIBS.append(_OURS)
    return _LIBS


def own_file(path: str) -> bool:
    """Is this the user's own source (not an installed library's, not the standard library's)?

    >>> own_file(os.__file__), own_file(__file__)  # the standard library's, torchdoctor's own
    (False, False)
    """
    full = os.path.realpath(path)
    return os.path.isfile(full) and not any(full.startswith(p) for p in _libs())
