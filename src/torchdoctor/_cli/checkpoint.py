"""``torchdoctor scan FILE|DIR...``: checkpoint files and directories, without importing torch.

``torchdoctor._cli.main`` hands ``scan`` here when every TARGET is an existing file or directory (what the
pre-commit hook passes); the answer then costs a header read, not an ``import torch``. Only ``--html`` (the device
map draws a ``ScanReport``) and ``--distributed`` (a process group) import torch. Several TARGETs are scanned one
after the other; the exit code is the worst: 0 nothing found, 1 problems (a global that can run code among
them), 2 a file or entry that could not be checked.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from torchdoctor._cli.common import UsageError, each_target, print_json
from torchdoctor._report.text import exit_code

__all__ = ["command", "nothing_to_check", "parse_want", "scan_path"]


def parse_want(args: Any) -> tuple[str | None, Any]:
    """``--device`` / ``--dtype`` as a device string and a checkpoint dtype, torch-free, with the same errors as
    the other verbs (``_cli.common.parse_common``)."""
    from torchdoctor._checkpoint.dtypes import location_str, parse_dtype, parse_location

    device = dtype = None
    text = getattr(args, "device", None)
    if text:
        if parse_location(str(text).strip()) is None:
            raise UsageError(f"not a device: {text!r}. Use a torch device string such as 'cpu', 'cuda:0', 'cuda:1', "
                             "'xpu', 'mps' or 'meta'.")
        device = location_str(str(text).strip())
    name = getattr(args, "dtype", None)
    if name:
        try:
            dtype = parse_dtype(name)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if not (dtype.is_floating_point or dtype.is_complex):
            raise UsageError(f"--dtype {name}: a floating dtype is expected (e.g. bfloat16, float16, float32); "
                             "integer and bool tensors are never cast or judged by dtype")
    return device, dtype


def _check(path: str, device: str | None, dtype: Any) -> Any:
    from torchdoctor._checkpoint.render import escape
    from torchdoctor._checkpoint.scan import CheckpointError, check_checkpoint

    try:
        return check_checkpoint(path, device=device, dtype=dtype)
    except CheckpointError as exc:
        raise UsageError(escape(str(exc))) from None
    except Exception as exc:  # a file shaped in a way no reader foresaw: one line and exit 2, never a traceback
        text = f"{path}: could not be checked ({type(exc).__name__}: {str(exc)[:160]}); please report this file's shape"
        raise UsageError(escape(text)) from None


def nothing_to_check(spec: str, report: Any) -> str | None:
    """Why a report holds nothing checkable, or None: no tensor anywhere and no finding beyond "the walk was cut
    short" (a pickle of deep nested containers). One line, exit 2, as ``scan`` says for an object."""
    if report.tensors or any(p.kind != "truncated" for p in report.problems):
        return None
    from torchdoctor._checkpoint.render import escape

    files = report.extra.get("files") or []
    what = f"a {files[0]['format']} file" if len(files) == 1 else f"{len(files)} files"
    return (f"nothing to check: {escape(spec)} holds no tensors ({what}); point TARGET at a checkpoint (a "
            "state_dict, a model folder, a distributed checkpoint)")


def _checked(spec: str, report: Any) -> Any:
    why = nothing_to_check(spec, report)
    if why is not None:
        raise UsageError(why)
    return report


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _code(report: Any) -> int:
    return exit_code(report.problems)  # 2 when an entry could not be checked, else 1 for problems, 0


def scan_path(path: str, args: Any) -> int:
    """One checkpoint TARGET: print the report (text or ``--json``) and return its exit code.

    Exit 0 clean, 1 problems, 2 when the file (or any entry of the directory) could not be read: the other
    entries of a directory are still checked and reported, and the worst code wins.
    """
    from torchdoctor._checkpoint.render import escape, render_checkpoint

    if getattr(args, "plan", False):
        raise UsageError(f"--plan lists moves of live objects; {escape(path)} is a checkpoint file, drop --plan")
    device, dtype = parse_want(args)
    report = _checked(path, _check(path, device, dtype))
    if getattr(args, "json", False):
        print_json(report.to_dict())
    else:
        print(render_checkpoint(report, limit=getattr(args, "limit", 40) or 40))
    return _code(report)


def _html(targets: list[str], args: Any) -> int:
    """``--html``: the device map draws a ``ScanReport`` (this imports torch)."""
    if len(targets) > 1:
        raise UsageError("--html writes the map of one TARGET; give one TARGET (or run once per TARGET)")
    if getattr(args, "plan", False):
        raise UsageError("--html draws a scan; drop --plan")
    from torchdoctor._checkpoint.render import render_checkpoint
    from torchdoctor._checkpoint.scan import to_scan_report

    device, dtype = parse_want(args)
    report = _checked(targets[0], _check(targets[0], device, dtype))
    try:
        to_scan_report(report).to_html(args.html)
    except OSError as exc:
        raise UsageError(f"cannot write the map to {args.html!r}: {exc.strerror or exc}") from exc
    print(f"device map written to {args.html}", file=sys.stderr)
    if getattr(args, "json", False):
        print_json(report.to_dict())
    else:
        print(render_checkpoint(report, limit=getattr(args, "limit", 40) or 40))
    return _code(report)


def command(args: argparse.Namespace) -> int:
    """``torchdoctor scan`` when every TARGET is an existing file or directory."""
    targets: list[str] = list(args.target) if isinstance(args.target, (list, tuple)) else [args.target]
    if getattr(args, "distributed", False):  # a process group: torch itself
        if len(targets) != 1:
            raise UsageError("--distributed checks one TARGET per run")
        from torchdoctor._distributed.cli import command as distributed_command

        one_target = argparse.Namespace(**vars(args))
        one_target.target = targets[0]
        return distributed_command("scan", one_target)
    if getattr(args, "html", None):
        return _html(targets, args)
    device, dtype = parse_want(args)
    if getattr(args, "plan", False):
        from torchdoctor._checkpoint.render import escape

        raise UsageError(f"--plan lists moves of live objects; {escape(targets[0])} is a checkpoint file, drop --plan")
    limit = getattr(args, "limit", 40) or 40
    as_json = getattr(args, "json", False)
    quiet = getattr(args, "quiet", False) or as_json  # a JSON document is read by a program: no progress line

    def one(spec: str, docs: list[Any]) -> int:
        from torchdoctor._checkpoint.render import render_checkpoint

        if quiet or not (_is_tty(sys.stderr) or os.environ.get("TORCHDOCTOR_PROGRESS", "") == "1"):
            # progress() draws nothing then; not importing it spares a thread module
            report = _check(spec, device, dtype)
        else:
            from torchdoctor._report.progress import progress

            with progress(f"reading {spec}", quiet=quiet):
                report = _check(spec, device, dtype)
        report = _checked(spec, report)
        if as_json:
            docs.append(report.to_dict())
        else:
            print(render_checkpoint(report, limit=limit))
        return _code(report)

    return each_target("scan", targets, args, one)
