"""Command line: ``torchdoctor scan|simulate|explain|env|demo``.

Each verb's command lives in its own module here and exposes ``command(args) -> int``; this module only parses
arguments and turns bad input into one clear line and exit code 2 (never a traceback). The verbs never import
the command line.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from torchdoctor._cli.common import UsageError
from torchdoctor._report.text import EXIT_OK, EXIT_USAGE


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchdoctor",
        description="Find, explain and fix device and dtype placement bugs in PyTorch.",
        epilog="Exit codes: 0 nothing found, 1 problems found, 2 bad usage or cannot check.",
    )
    sub = p.add_subparsers(dest="verb", metavar="VERB")

    s = sub.add_parser("scan", help="list tensors on the wrong device/dtype, by path (objects, checkpoint files, dirs)")
    s.add_argument("target", metavar="TARGET", help="checkpoint file or dir, or path/to/file.py:name, or package.module:name")
    s.add_argument("--device", help="expected device, e.g. cuda:0 (for a checkpoint: where it would load)")
    s.add_argument("--dtype", help="expected floating dtype, e.g. bfloat16")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.add_argument("--plan", action="store_true", help="list what torchdoctor.move would do (needs --device or --dtype)")
    s.add_argument("--limit", type=int, default=40, help="rows shown per section in text output (default 40)")
    s.add_argument("--distributed", action="store_true",
                   help="under torchrun: every rank scans, rank 0 prints one report of all ranks")

    m = sub.add_parser("simulate", help="would TARGET run on cuda:N / xpu / mps? (no hardware needed)")
    m.add_argument("target", metavar="TARGET")
    m.add_argument("--device", required=True)
    m.add_argument("--dtype")
    m.add_argument("--assume-device", dest="assume_device", help="treat tensors on meta as holding data on this device")
    m.add_argument("--count", type=int, default=None, help="number of virtual devices (default: enough for --device)")
    m.add_argument("--json", action="store_true")
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.verb:
        parser.print_help()
        return EXIT_USAGE
    try:
        module = importlib.import_module(_VERB_MODULES[args.verb])
        return int(module.command(args))
    except UsageError as exc:
        print(f"torchdoctor {args.verb}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK

