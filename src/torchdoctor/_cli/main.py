"""Command line: ``torchdoctor scan|simulate|explain|env|demo``.

Each verb's command lives in its own module here and exposes ``command(args) -> int``; this module only parses
arguments and turns bad input into one clear line and exit code 2 (never a traceback). The verbs never import
the command line.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from torchdoctor._cli.common import UsageError, positive_int, read_config
from torchdoctor._report.terminal import output_width
from torchdoctor._report.text import EXIT_USAGE, line_width


def _version() -> str:
    from importlib import metadata

    from torchdoctor import __version__

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "not installed"
    return f"torchdoctor {__version__} (torch {torch_version}, Python {sys.version.split()[0]})"


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line (``torchdoctor simulate: argument --count: ...``), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="torchdoctor",
        description="Find, explain and fix device and dtype placement bugs in PyTorch.",
        epilog="Exit codes: 0 nothing found, 1 problems found, 2 bad usage or cannot check. Defaults for "
               "--device, --dtype, --profile, --assume-device and --limit come from [tool.torchdoctor] in the "
               "nearest pyproject.toml.",
    )
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="verb", metavar="VERB")
    quiet = _Parser(add_help=False)
    quiet.add_argument("-q", "--quiet", action="store_true", help="no progress line on stderr")

    s = sub.add_parser("scan", parents=[quiet],
                       help="list tensors on the wrong device/dtype, by path (objects, checkpoint files, dirs)")
    s.add_argument("target", metavar="TARGET", nargs="+",
                   help="checkpoint file or dir, or path/to/file.py:name, or package.module:name (several allowed)")
    s.add_argument("--device", help="expected device, e.g. cuda:0 (for a checkpoint: where it would load)")
    s.add_argument("--dtype", help="expected floating dtype, e.g. bfloat16")
    s.add_argument("--json", action="store_true", help="print the report as JSON (a list of reports for several TARGETs)")
    s.add_argument("--html", metavar="FILE", help="write the device map (one self-contained HTML page) to FILE")
    s.add_argument("--plan", action="store_true", help="list what torchdoctor.move would do (needs --device or --dtype)")
    s.add_argument("--limit", type=positive_int, default=None, help="rows shown per section in text output (default 40)")
    s.add_argument("--distributed", action="store_true",
                   help="under torchrun: every rank scans, rank 0 prints one report of all ranks")

    m = sub.add_parser("simulate", parents=[quiet], help="would TARGET run on cuda:N / xpu / mps? (no hardware needed)")
    m.add_argument("target", metavar="TARGET", nargs="+", help="path/to/file.py:name or package.module:name (several allowed)")
    m.add_argument("--device", help="the virtual device, e.g. cuda:1, mps, xpu (default: the profile's type)")
    m.add_argument("--dtype")
    m.add_argument("--profile", metavar="NAME",
                   help="device preset: t4, v100, a100, h100, l4, rtx3090, rtx4090, m1, m2, m3, arc, cpu ... "
                        "(`--profile help` lists them)")
    m.add_argument("--assume-device", dest="assume_device", help="treat tensors on meta as holding data on this device")
    m.add_argument("--count", type=positive_int, default=None, help="number of virtual devices (default: enough for --device)")
    m.add_argument("--limit", type=positive_int, default=None, help="problems shown in text output (default 40)")
    m.add_argument("--json", action="store_true")
    m.add_argument("--html", metavar="FILE", help="write the device map of the problems found to FILE")
    m.add_argument("--distributed", action="store_true",
                   help="under torchrun: every rank simulates on virtual cuda:LOCAL_RANK, rank 0 prints one report")

    e = sub.add_parser("explain", help="explain a device/dtype error message or a whole log")
    e.add_argument("file", nargs="?", default="-", metavar="FILE", help="log file, or - for standard input (default)")
    e.add_argument("--json", action="store_true")

    v = sub.add_parser("env", help="environment doctor: torch build, drivers, IPEX/bnb conflicts, device choice")
    v.add_argument("--json", action="store_true")
    v.add_argument("--facts", metavar="FILE", help="diagnose facts saved by `torchdoctor env --json` (offline)")
    v.add_argument("--probe", action="store_true", help="also ask torch's device APIs (may initialise a device)")
    v.add_argument("--markdown", action="store_true", help="print a Markdown block to paste into a bug report")

    t = sub.add_parser("trace", help="run a script and record every device/dtype change of its tensors, with the call and line")
    t.add_argument("--moves", action="store_true", help="record moves and casts (default when neither is given)")
    t.add_argument("--lora", action="store_true", help="record LoRA load/fuse/unfuse/unload and adapter changes")
    t.add_argument("--file", metavar="OUT", help="also write JSON lines to OUT")
    t.add_argument("script", metavar="SCRIPT", help="the Python script to run (as `python SCRIPT ARGS...` would)")
    t.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS")

    d = sub.add_parser("demo", help="diagnose and fix a small broken diffusion-style model")
    d.add_argument("--json", action="store_true")
    return p


_VERB_MODULES = {
    "scan": "torchdoctor._cli.scan",
    "simulate": "torchdoctor._cli.simulate",
    "explain": "torchdoctor._cli.explain",
    "env": "torchdoctor._cli.env",
    "demo": "torchdoctor._cli.demo",
    "trace": "torchdoctor._cli.trace",
}


_CONFIGURED = ("device", "dtype", "profile", "assume_device", "limit")


def _apply_config(args: argparse.Namespace) -> None:
    """Options the command line left unset take their value from ``[tool.torchdoctor]``."""
    if args.verb not in ("scan", "simulate"):
        return
    path, table = read_config()
    args.config = path if table else None
    for key in _CONFIGURED:
        if key in table and hasattr(args, key) and getattr(args, key) is None:
            setattr(args, key, table[key])
    if getattr(args, "limit", None) is None and hasattr(args, "limit"):
        args.limit = 40


class _Stdout:
    """stdout that survives a reader going away (``| head -1``): later writes are dropped, the exit code stays
    the verb's own."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return int(self._stream.write(text))
            except BrokenPipeError:
                self.broken = True
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self.broken = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse printed the usage error (or --help / --version): a code, not an exit
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if not args.verb:
        parser.print_help()
        return EXIT_USAGE
    real, out = sys.stdout, _Stdout(sys.stdout)
    sys.stdout = out  # type: ignore[assignment]
    try:
        _apply_config(args)
        module = importlib.import_module(_VERB_MODULES[args.verb])
        with line_width(output_width(real)):
            code = int(module.command(args))
    except UsageError as exc:
        print(f"torchdoctor {args.verb}: {exc}", file=sys.stderr)
        code = EXIT_USAGE
    except KeyboardInterrupt:
        code = 130
    finally:
        sys.stdout = real
    if out.broken:  # the interpreter's last flush of stdout would fail again and print a traceback
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, real.fileno())
        except (OSError, ValueError, AttributeError):
            pass
    return code

