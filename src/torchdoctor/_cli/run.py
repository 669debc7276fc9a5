"""``torchdoctor run [--device D] [--dtype D] [--profile P] [--mode M] [--json] [--file OUT] script.py ARGS`` (or
``-m module ARGS``): an unmodified program, watched; with ``--device``, on virtual devices.

The program's own exit code is the command's, except that a program that ended with 0 after placement errors
were met or problems recorded is 1, as on every verb (a summary goes to stderr, or as JSON to stdout with
``--json`` / to ``--file``); 2 only when torchdoctor itself was used wrongly. A folder or zip archive with a
``__main__.py`` runs as ``python FOLDER`` runs it.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from torchdoctor._cli.common import GUARD_MODES, UsageError, mps_is_one, parse_common

USAGE = ("torchdoctor run [--device cuda:1|xpu|mps] [--dtype D] [--profile P] [--count N] [--mode M] script.py ARGS | "
         "-m module ARGS")


def add_parser(subparsers: Any, parents: list[argparse.ArgumentParser] | None = None) -> argparse.ArgumentParser:
    r = subparsers.add_parser(
        "run", parents=parents or [], help="run a program as python would, explaining every placement error it "
                                           "raises, catches or logs (with --device: on virtual cuda:N / xpu / mps)",
        usage="torchdoctor run [options] script.py [ARGS ...]\n       torchdoctor run [options] -m MODULE [ARGS ...]",
        description="Run an unmodified program as `python script.py ARGS` would, and explain each placement error it "
                    "raises, catches or logs: the culprit tensor by path, its last move, and a fix. With --device, the "
                    "whole program runs on virtual devices (no GPU needed): `torchdoctor run --device cuda app.py`.")
    add_arguments(r)
    return r  # type: ignore[no-any-return]


def add_arguments(r: argparse.ArgumentParser) -> None:
    r.add_argument("--device", help="run on this virtual device (cuda, cuda:1, xpu, mps): the program sees that "
                                    "hardware, none is needed on this machine")
    r.add_argument("--dtype", help="the dtype the virtual run expects the model in (e.g. bfloat16)")
    r.add_argument("--profile", metavar="NAME", help="device preset for --device (t4, a100, h100, m2, arc ...)")
    r.add_argument("--count", type=int, metavar="N",
                   help="how many virtual devices of --device's kind the machine has (a program that uses two GPUs: "
                        "--count 2; default: enough for --device)")
    r.add_argument("--mode", choices=[m for m in GUARD_MODES if m != "off"], default="explain",
                   help="how guard watches the program: explain (default, no per-op cost: explains an error "
                        "that escapes), strict (checks ops before they run and raises at the first bad one), fix "
                        "(aligns the operands and goes on, recording each fix), warn (like fix, with a warning)")
    r.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    r.add_argument("--file", metavar="OUT", help="also write the JSON summary to OUT")
    r.add_argument("--no-trace", dest="trace", action="store_false",
                   help="do not record moves and casts (the culprit's last move is then unknown)")
    r.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE ARGS",
                   help="run a module as `python -m MODULE ARGS` would (everything after it is the program's)")
    r.add_argument("program", nargs=argparse.REMAINDER, metavar="script.py ARGS",
                   help="the program (a script, or a folder with __main__.py) and its own arguments")


def command(args: argparse.Namespace) -> int:
    rest = list(args.program or [])
    if rest and rest[0] == "--":
        rest = rest[1:]
    module = None
    script = None
    if args.module is not None:
        if not args.module:
            raise UsageError(f"-m needs a module name; usage: {USAGE}")
        module, rest = args.module[0], list(args.module[1:]) + rest
    else:
        if not rest:
            raise UsageError(f"run needs a program; usage: {USAGE}")
        script, rest = rest[0], rest[1:]
        if os.path.isdir(script) and not os.path.isfile(os.path.join(script, "__main__.py")):
            raise UsageError(f"the folder {script!r} has no __main__.py, so python cannot run it either; usage: "
                             f"{USAGE}")
        if not os.path.exists(script):
            raise UsageError(f"the script {script!r} does not exist; usage: {USAGE}")
    device, dtype = parse_common(args)
    if device is not None and device.type not in ("cuda", "xpu", "mps"):
        raise UsageError(f"--device {args.device}: a virtual device is cuda:N, xpu or mps (to run on this machine's "
                         "own hardware, leave --device out)")
    if (args.dtype or args.profile or args.count) and device is None:
        raise UsageError("--dtype, --profile and --count describe the virtual device: give --device too (e.g. "
                         "--device cuda:0)")
    if args.count is not None and args.count < 1:
        raise UsageError(f"--count {args.count}: the number of virtual devices is 1 or more (e.g. --count 2)")
    mps_is_one(device, args.count)
    if args.file:
        try:
            open(args.file, "w", encoding="utf-8").close()
        except OSError as exc:
            raise UsageError(f"cannot write --file {args.file!r}: {exc.strerror or exc}") from None
    if args.profile:
        from torchdoctor._rules.presets import preset

        try:
            preset(args.profile)
        except ValueError as exc:
            raise UsageError(f"--profile: {exc}") from None

    import json  # here, not at the top: every CLI start builds this verb's parser

    from torchdoctor._run.program import run

    from torchdoctor._cli.child import ProgramSignals

    own = _own_streams()  # before the program runs: it may close or swap its streams
    try:
        with ProgramSignals("run", 2 if own[2][1] is None else own[2][1]):
            report = run(script, rest, module=module, device=args.device, dtype=dtype, profile=args.profile,
                         mode=args.mode, trace=args.trace, count=args.count,
                         sources={k: f"--{k}" for k in ("device", "dtype", "profile") if getattr(args, k, None)})
    except ValueError as exc:  # the virtual device and the profile disagree
        _close(own)
        raise UsageError(str(exc)) from None
    doc = report.to_dict()
    if args.file:
        with open(args.file, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2, default=str)
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):  # the program's output first
        try:
            stream.flush()  # type: ignore[union-attr]
        except (AttributeError, OSError, ValueError):
            pass
    try:
        if report.missing and not args.json:  # python's one line was printed; nothing ran to summarise
            return 1
        if args.json:
            _write(own[1], json.dumps(doc, indent=2, default=str) + "\n")
        else:
            _write(own[2], report.text() + "\n")
    finally:
        _close(own)
    return command_exit(report)


def command_exit(report: Any) -> int:
    """The program's own exit code; when it ended well but placement errors or problems were met, 1 (exit codes
    are the same on every verb: 1 problems found)."""
    code = int(report.exit_code)
    return 1 if code == 0 and not report.ok else code


def _own_streams() -> dict[int, tuple[Any, int | None]]:
    """Standard output and error as they are now, for the summary: the stream objects, and copies of their
    descriptors for when the program closed them. A program that closes ``sys.stderr`` or swaps ``sys.stdout``
    keeps its own exit code, and the summary still reaches where the command's output was going."""
    out: dict[int, tuple[Any, int | None]] = {}
    for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
        try:
            copy: int | None = os.dup(fd)  # not inherited by what the program starts (PEP 446)
        except OSError:
            copy = None
        out[fd] = (stream, copy)
    return out


def _write(own: tuple[Any, int | None], text: str) -> None:
    stream, copy = own
    try:
        if not getattr(stream, "closed", False):
            stream.write(text)
            stream.flush()
            return
    except (OSError, ValueError):  # closed under us, or the reader went away (`| head`)
        pass
    if copy is not None:
        encoding = getattr(stream, "encoding", None) or "utf-8"
        try:
            os.write(copy, text.encode(encoding, "backslashreplace"))
        except (OSError, LookupError):
            pass


def _close(own: dict[int, tuple[Any, int | None]]) -> None:
    for _, copy in own.values():
        if copy is not None:
            os.close(copy)


def main(argv: list[str] | None = None) -> int:
    """``python -m torchdoctor._cli.run ...`` (the same as ``torchdoctor run ...``)."""
    parser = argparse.ArgumentParser(prog="torchdoctor run", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return command(args)
    except UsageError as exc:
        print(f"torchdoctor run: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
