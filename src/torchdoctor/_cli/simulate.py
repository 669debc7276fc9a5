"""``torchdoctor simulate TARGET --device D``: would it run there, without the hardware?"""

from __future__ import annotations

import argparse

from torchdoctor._cli.common import UsageError, failure, parse_common, print_json, resolve_target
from torchdoctor._placement import parse_device
from torchdoctor._rules.profile import DeviceProfile
from torchdoctor._virtual.simulate import simulate
from torchdoctor._virtual.tensor import is_virtual


def command(args: argparse.Namespace) -> int:
    if getattr(args, "distributed", False):
        from torchdoctor._distributed.cli import command as distributed_command

        return distributed_command("simulate", args)
    import os

    device, dtype = parse_common(args)
    target = resolve_target(args.target)
    if isinstance(target, (str, os.PathLike)):
        raise UsageError(f"simulate needs an object (path/to/file.py:name or package.module:name); {args.target!r} is "
                         "a file or directory: use `torchdoctor scan` for checkpoints")
    try:
        assume = parse_device(args.assume_device) if getattr(args, "assume_device", None) else None
        profile = DeviceProfile.for_device(device if is_virtual(device) else "cuda")
        if getattr(args, "count", None) is not None:
            if args.count < 1:
                raise ValueError(f"--count {args.count}: the number of virtual devices must be at least 1")
            profile = profile.with_count(int(args.count))
        report = simulate(target, device=device, dtype=dtype, assume_device=assume, profile=profile)
    except (ValueError, TypeError) as exc:  # bad arguments, or an object that cannot be copied
        raise UsageError(str(exc)) from exc
    except Exception as exc:  # the target's own code failed before any placement problem was seen
        raise UsageError(f"running {args.target} failed before any placement problem: {failure(exc)}") from exc
    if getattr(args, "json", False):
        print_json(report.to_dict())
    else:
        print(report.text())
    return report.exit_code()
