"""Is a source file the user's own (not an installed library's, not the standard library's)? Imports nothing of
torchdoctor's: a virtual run asks it on every module cast the program makes, before anything has failed."""

from __future__ import annotations

import os
import sys
import sysconfig

LIBS = tuple(p for p in {sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib"),
                         sys.prefix, getattr(sys, "base_prefix", sys.prefix)} if p)


def own_file(path: str) -> bool:
    """Is this the user's own source (not an installed library's, not the standard library's)?

    >>> own_file(os.__file__)
    False
    """
    full = os.path.realpath(path)
    return os.path.isfile(full) and not any(full.startswith(os.path.realpath(p) + os.sep) for p in LIBS)
