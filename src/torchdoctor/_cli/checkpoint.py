"""``torchdoctor scan FILE|DIR``: checkpoint files and directories (the scan command hands paths here)."""

from __future__ import annotations

from typing import Any

from torchdoctor._cli.common import UsageError, parse_common, print_json


def scan_path(path: str, args: Any) -> int:
    """``torchdoctor scan FILE|DIR``: print the report (text or ``--json``); exit 0 clean, 1 problems, 2 unreadable."""
    from torchdoctor._checkpoint.scan import CheckpointError, render_checkpoint, scan_checkpoint

    device, dtype = parse_common(args)
    if getattr(args, "plan", False):
        raise UsageError(f"--plan lists moves of live objects; {path} is a checkpoint file, drop --plan")
    try:
        report = scan_checkpoint(path, device=device, dtype=dtype)
    except CheckpointError as exc:
        raise UsageError(str(exc)) from None
    if getattr(args, "json", False):
        print_json(report.to_dict())
    else:
        print(render_checkpoint(report, limit=getattr(args, "limit", 40) or 40))
    return 0 if report.ok else 1
