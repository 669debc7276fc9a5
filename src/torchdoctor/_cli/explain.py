"""``torchdoctor explain [FILE|-]``: diagnose a pasted error or a whole log."""

from __future__ import annotations

import argparse
import io
import sys
from typing import IO

from torchdoctor._cli.common import UsageError, print_json
from torchdoctor._explain.api import _blocks, _explain_blocks, render, to_json


def command(args: argparse.Namespace) -> int:
    import os


    path = getattr(args, "file", "-") or "-"
    if path == "-":
        buffer = getattr(sys.stdin, "buffer", None)
        stream: IO[str] = (io.TextIOWrapper(buffer, encoding="utf-8", errors="replace", newline=None)
                           if buffer is not None else sys.stdin)
        found = _explain_blocks(_blocks(stream), None)
    else:
        if os.path.isdir(path):
            raise UsageError(f"cannot read {path!r}: it is a directory")
        try:
            with open(path, encoding="utf-8", errors="replace", newline=None) as fh:
                found = _explain_blocks(_blocks(fh), None)
        except OSError as exc:
            raise UsageError(f"cannot read {path!r}: {exc.strerror or exc}") from exc
    if getattr(args, "json", False):
        print_json(to_json(found, None if path == "-" else path))
    else:
        print(render(found))
    return 1 if found else 0
