"""``torchdoctor explain [FILE|-]``: diagnose a pasted error or a whole log."""

from __future__ import annotations

import argparse
import io
import os
import sys
from typing import IO

from torchdoctor._cli.common import UsageError, print_json
from torchdoctor._explain.api import explain_stream


def _is_terminal(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):  # closed or replaced streams are not terminals
        return False


def command(args: argparse.Namespace) -> int:
    path = getattr(args, "file", "-") or "-"
    if path == "-":
        if _is_terminal(sys.stdin):  # a person at a prompt, not a pipe: say what the silence is waiting for
            eof = "Ctrl-Z then Enter" if os.name == "nt" else "Ctrl-D"
            print(f"torchdoctor explain: reading the error from standard input; paste it, then press {eof} "
                  "(or give a file: torchdoctor explain error.log)", file=sys.stderr, flush=True)
        buffer = getattr(sys.stdin, "buffer", None)
        stream: IO[str] = (io.TextIOWrapper(buffer, encoding="utf-8", errors="replace", newline=None)
                           if buffer is not None else sys.stdin)
        if _is_terminal(sys.stdin):  # one Ctrl-D ends a paste: read to that end-of-file once, not block by block
            stream = io.StringIO(stream.read())
        report = explain_stream(stream)
    else:
        if os.path.isdir(path):
            raise UsageError(f"cannot read {path!r}: it is a directory")
        try:
            with open(path, encoding="utf-8", errors="replace", newline=None) as fh:
                report = explain_stream(fh, path)
        except OSError as exc:
            raise UsageError(f"cannot read {path!r}: {exc.strerror or exc}") from exc
    if getattr(args, "json", False):
        print_json(report.to_dict())
    else:
        print(report)
    return report.exit_code()
