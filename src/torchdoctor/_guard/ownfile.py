"""Is a source file the user's own (not an installed library's, not the standard library's)? Imports nothing of
torchdoctor's: a virtual run asks it on every module cast the program makes, before anything has failed. The
install paths are read on the first question (``sysconfig`` costs a millisecond to import: never at start)."""

from __future__ import annotations

import os
import sys

_LIBS: list[str] = []  # the real paths of the install's library folders, filled on the first call


def _libs() -> list[str]:
    if not _LIBS:
        import sysconfig

        paths = sysconfig.get_paths()
        _LIBS.extend(os.path.realpath(p) + os.sep for p in {paths.get("purelib"), paths.get("platlib"), sys.prefix,
                                                              getattr(sys, "base_prefix", sys.prefix)} if p)
    return _LIBS


def own_file(path: str) -> bool:
    """Is this the user's own source (not an installed library's, not the standard library's)?

    >>> own_file(os.__file__)
    False
    """
    full = os.path.realpath(path)
    return os.path.isfile(full) and not any(full.startswith(p) for p in _libs())
