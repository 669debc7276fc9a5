"""``torchdoctor scan TARGET...``: live objects (``--plan`` lists what ``move`` would do) and checkpoint files.

Several TARGETs are scanned one after the other (what a pre-commit hook passes); the exit code is the worst
of them, and a TARGET that cannot be checked is reported on stderr without stopping the others.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from torchdoctor._cli.common import each_target, UsageError, parse_common, resolve_target
from torchdoctor._report.model import ScanReport, Target
from torchdoctor._report.progress import progress
from torchdoctor._report.terminal import emit
from torchdoctor._report.text import EXIT_OK, EXIT_PROBLEMS, exit_code, schema


def single(args: argparse.Namespace, target: str) -> argparse.Namespace:
    """``args`` for one TARGET, as the per-target handlers (checkpoint, distributed) expect."""
    one = argparse.Namespace(**vars(args))
    one.target = target
    return one


def write_html(report: Any, path: str) -> None:
    """The device map of any report with ``to_dict()`` (its own ``to_html`` when it has one)."""
    try:
        if hasattr(report, "to_html"):
            report.to_html(path)
        else:
            from torchdoctor._report.html import render_html

            with open(path, "w", encoding="utf-8") as fh:
                fh.write(render_html(report.to_dict()))
    except OSError as exc:
        raise UsageError(f"cannot write the map to {path!r}: {exc.strerror or exc}") from exc
    print(f"device map written to {path}", file=sys.stderr)


def _plan(spec: str, obj: Any, args: argparse.Namespace, device: Any, dtype: Any) -> tuple[int, dict[str, Any], str]:
    if device is None and dtype is None:
        raise UsageError("--plan needs --device and/or --dtype: the plan is what move(obj, device, dtype) would do")
    from torchdoctor._move.plan import plan
    from torchdoctor._report.folded import fold_plan

    steps = plan(obj.obj if isinstance(obj, Target) else obj, device=device, dtype=dtype)
    # a plan is a scan's answer to "what would move(...) change?": the scan schema, with the steps under "plan"
    doc = {"schema": schema("scan"), "ok": not steps, "source": spec, "plan": [s.to_dict() for s in steps],
           "missed_by_module_to": [s.path for s in steps if s.missed_by_module_to]}
    lines = [f"{len(steps)} tensor(s) would move:" if steps else "nothing to move"]
    lines += fold_plan(steps, args.limit or 40)
    return (EXIT_PROBLEMS if steps else EXIT_OK), doc, "\n".join(lines)


def _one(spec: str, args: argparse.Namespace, device: Any, dtype: Any, docs: list[Any]) -> int:
    from torchdoctor._scan.scan import scan

    with progress(f"loading {spec}", quiet=args.quiet or args.json):
        target = resolve_target(spec)
    if isinstance(target, str):
        from torchdoctor._cli.checkpoint import scan_path

        if args.html or (args.json and len(args.target) > 1):  # the report itself is needed: a map, one list
            from torchdoctor._checkpoint.scan import CheckpointError, scan_checkpoint

            try:
                with progress(f"reading {spec}", quiet=args.quiet or args.json):
                    report = scan_checkpoint(target, device=device, dtype=dtype)
            except CheckpointError as exc:
                raise UsageError(str(exc)) from None
            return _finish(report, args, docs)
        with progress(f"reading {spec}", quiet=args.quiet or args.json):
            return scan_path(target, single(args, spec))
    if args.plan:
        code, doc, text = _plan(spec, target, args, device, dtype)
        if args.json:
            docs.append(doc)
        else:
            emit(text)
        return code
    with progress(f"scanning {spec}", quiet=args.quiet or args.json):
        report = scan(target, device=device, dtype=dtype)
    report = with_sources(dataclasses.replace(report, source=spec), getattr(args, "sources", {}))
    if isinstance(target, dict) and report.tensors:  # components by key: a fix reads obj['model'].to(...)
        report = dataclasses.replace(report, extra={**report.extra, "keyed": True})
    if not report.tensors:
        raise UsageError(f"nothing to check: {spec} holds no tensors (a {type(target).__name__}); "
                         "point TARGET at a model, a pipeline or a checkpoint")
    return _finish(report, args, docs)


def with_sources(report: ScanReport, sources: dict[str, str]) -> ScanReport:
    """The report with each asked-for expectation saying where it came from: ``device_source`` /
    ``dtype_source`` in ``expected`` (rule ``config`` when ``[tool.torchdoctor]`` set it) and the messages'
    "(device= asked for)" / "dtype=X was asked for" naming the file or the option."""
    if not sources or not report.expected:
        return report
    expected: dict[str, dict[str, str]] = {}
    for comp, e in report.expected.items():
        e = dict(e)
        for key in ("device", "dtype"):
            if e.get(f"{key}_rule") == "explicit" and key in sources:
                e[f"{key}_source"] = sources[key]
                if sources[key].startswith("[tool.torchdoctor]"):
                    e[f"{key}_rule"] = "config"
        expected[comp] = e
    problems = []
    for p in report.problems:
        msg = p.message
        if "device" in sources:
            msg = msg.replace(" (device= asked for)", f" (device= from {sources['device']})")
        if "dtype" in sources and msg.endswith(" was asked for") and "dtype=" in msg:
            msg = msg[: -len(" was asked for")] + f" was set by {sources['dtype']}"
        problems.append(p if msg == p.message else dataclasses.replace(p, message=msg))
    return dataclasses.replace(report, expected=expected, problems=tuple(problems))


def _finish(report: ScanReport, args: argparse.Namespace, docs: list[Any]) -> int:
    if args.html:
        write_html(report, args.html)
    if args.json:
        docs.append(report.to_dict())
    elif report.extra.get("groups") is not None:
        from torchdoctor._checkpoint.render import render_checkpoint

        emit(render_checkpoint(report, limit=args.limit))
    else:
        emit(report.text(limit=args.limit))
    return exit_code(report.problems)


def command(args: argparse.Namespace) -> int:
    targets: list[str] = list(args.target) if isinstance(args.target, (list, tuple)) else [args.target]
    if getattr(args, "distributed", False):
        if len(targets) != 1:
            raise UsageError("--distributed checks one TARGET per run")
        from torchdoctor._distributed.cli import command as distributed_command

        return distributed_command("scan", single(args, targets[0]))
    if args.html and len(targets) > 1:
        raise UsageError("--html writes the map of one TARGET; give one TARGET (or run once per TARGET)")
    if args.html and args.plan:
        raise UsageError("--html draws a scan; drop --plan")
    device, dtype = parse_common(args)
    return each_target("scan", targets, args, lambda spec, docs: _one(spec, args, device, dtype, docs))
