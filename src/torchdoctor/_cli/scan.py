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
    if getattr(args, "distributed", False):
        from torchdoctor._distributed.cli import command as distributed_command

        return distributed_command("scan", args)
    device, dtype = parse_common(args)
    target = resolve_target(args.target)
    if isinstance(target, str):
        from torchdoctor._cli.checkpoint import scan_path

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
