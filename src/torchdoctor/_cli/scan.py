"""``torchdoctor scan TARGET``: live objects (``--plan`` lists what ``move`` would do) and checkpoint files."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from torchdoctor._cli.common import UsageError, parse_common, print_json, resolve_target
from torchdoctor._report.model import Target
from torchdoctor._scan.scan import scan


def _plan_lines(items: Iterable[Any]) -> list[str]:
    return [str(i) for i in items]


def command(args: argparse.Namespace) -> int:
    device, dtype = parse_common(args)
    target = resolve_target(args.target)
    if isinstance(target, str):
        return scan_path(target, args)
    if args.plan:
        if device is None and dtype is None:
            raise UsageError("--plan needs --device and/or --dtype: the plan is what move(obj, device, dtype) would do")
        from torchdoctor._move.plan import plan

        steps = plan(target.obj if isinstance(target, Target) else target, device=device, dtype=dtype)
        if args.json:
            print_json({"schema": "torchdoctor/plan/1", "ok": not steps, "steps": [s.to_dict() for s in steps]})
        else:
            print(f"{len(steps)} tensor(s) would move:" if steps else "nothing to move")
            for line in _plan_lines(steps[: args.limit]):
                print(f"  {line}")
            if len(steps) > args.limit:
                print(f"  ... and {len(steps) - args.limit} more (use --json for all)")
        return 1 if steps else 0
    report = scan(target, device=device, dtype=dtype)
    report.source = args.target
    if args.json:
        print_json(report.to_dict())
    else:
        print(report.text(limit=args.limit))
    return 0 if report.ok else 1


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
