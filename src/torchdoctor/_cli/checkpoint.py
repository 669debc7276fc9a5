"""``torchdoctor scan FILE|DIR``: checkpoint files and directories (the scan command hands paths here)."""

from __future__ import annotations

from typing import Any

from torchdoctor._cli.common import UsageError, parse_common, print_json
from torchdoctor._report.text import EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE


def scan_path(path: str, args: Any) -> int:
    """``torchdoctor scan FILE|DIR``: print the report (text or ``--json``).

    Exit 0 clean, 1 problems, 2 when the file (or any entry of the directory) could not be read: the other
    entries of a directory are still checked and reported, and the worst code wins.
    """
    from torchdoctor._checkpoint.render import escape, render_checkpoint
    from torchdoctor._checkpoint.scan import CheckpointError, scan_checkpoint

    device, dtype = parse_common(args)
    if getattr(args, "plan", False):
        raise UsageError(f"--plan lists moves of live objects; {escape(path)} is a checkpoint file, drop --plan")
    try:
        report = scan_checkpoint(path, device=device, dtype=dtype)
    except CheckpointError as exc:
        raise UsageError(escape(str(exc))) from None
    except Exception as exc:  # a file shaped in a way no reader foresaw: one line and exit 2, never a traceback
        text = f"{path}: could not be checked ({type(exc).__name__}: {str(exc)[:160]}); please report this file's shape"
        raise UsageError(escape(text)) from None
    if getattr(args, "json", False):
        print_json(report.to_dict())
    else:
        print(render_checkpoint(report, limit=getattr(args, "limit", 40) or 40))
    if any(p.kind == "unreadable" for p in report.problems):
        return EXIT_USAGE
    return EXIT_OK if report.ok else EXIT_PROBLEMS
