"""Command line: ``torchdoctor scan|simulate|explain|env|demo``.

Each verb lives in its own module and exposes ``cli(args) -> int``; this module only parses arguments,
resolves ``TARGET`` and turns bad input into one clear line and exit code 2 (never a traceback).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from typing import Any

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit 2."""


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

    m = sub.add_parser("simulate", help="would TARGET run on cuda:N / xpu / mps? (no hardware needed)")
    m.add_argument("target", metavar="TARGET")
    m.add_argument("--device", required=True)
    m.add_argument("--dtype")
    m.add_argument("--assume-device", dest="assume_device", help="treat tensors on meta as holding data on this device")
    m.add_argument("--count", type=int, default=None, help="number of virtual devices (default: enough for --device)")
    m.add_argument("--json", action="store_true")

    e = sub.add_parser("explain", help="explain a device/dtype error message or a whole log")
    e.add_argument("file", nargs="?", default="-", metavar="FILE", help="log file, or - for standard input (default)")
    e.add_argument("--json", action="store_true")

    v = sub.add_parser("env", help="environment doctor: torch build, drivers, IPEX/bnb conflicts, device choice")
    v.add_argument("--json", action="store_true")
    v.add_argument("--facts", metavar="FILE", help="diagnose facts saved by `torchdoctor env --json` (offline)")
    v.add_argument("--probe", action="store_true", help="also ask torch's device APIs (may initialise a device)")

    d = sub.add_parser("demo", help="diagnose and fix a small broken diffusion-style model")
    d.add_argument("--json", action="store_true")
    return p


_VERB_MODULES = {
    "scan": "torchdoctor._scan",
    "simulate": "torchdoctor._simulate",
    "explain": "torchdoctor._explain",
    "env": "torchdoctor._env",
    "demo": "torchdoctor._demo",
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.verb:
        parser.print_help()
        return EXIT_USAGE
    try:
        module = importlib.import_module(_VERB_MODULES[args.verb])
        return int(module.cli(args))
    except UsageError as exc:
        print(f"torchdoctor {args.verb}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def load_target(spec: str) -> Any:
    """Resolve ``path/to/file.py:name`` or ``package.module:name`` (split on the last ``:``).

    A function or class is called with no arguments; the result (or the object itself) is returned. A 2-tuple
    whose second item is a tuple or dict becomes a ``Target(obj, args/kwargs)``.
    """
    from torchdoctor._report import Target

    if ":" not in spec or spec.endswith(":"):
        raise UsageError(
            f"TARGET {spec!r} is neither an existing file or directory nor 'path/to/file.py:name' or 'package.module:name'"
        )
    where, name = spec.rsplit(":", 1)
    if where.endswith(".py") or os.sep in where or "/" in where:
        if not os.path.isfile(where):
            raise UsageError(f"no such file: {where!r} (TARGET {spec!r})")
        mod_name = "_torchdoctor_target_" + os.path.splitext(os.path.basename(where))[0].replace("-", "_")
        spec_obj = importlib.util.spec_from_file_location(mod_name, where)
        if spec_obj is None or spec_obj.loader is None:
            raise UsageError(f"cannot import {where!r}")
        module = importlib.util.module_from_spec(spec_obj)
        sys.modules[mod_name] = module
        sys.path.insert(0, os.path.dirname(os.path.abspath(where)))
        try:
            spec_obj.loader.exec_module(module)
        except (Exception, SystemExit) as exc:  # a script that exits on import must not set our exit code
            raise UsageError(f"importing {where!r} failed: {failure(exc)}") from exc
        finally:
            sys.path.pop(0)
    else:
        try:
            module = importlib.import_module(where)
        except (Exception, SystemExit) as exc:
            raise UsageError(f"cannot import module {where!r}: {failure(exc)}") from exc
    if not hasattr(module, name):
        raise UsageError(f"{where!r} has no attribute {name!r}")
    obj = getattr(module, name)
    if isinstance(obj, type) or (callable(obj) and type(obj).__name__ in ("function", "builtin_function_or_method")):
        try:
            obj = obj()
        except (Exception, SystemExit) as exc:
            raise UsageError(f"calling {spec} with no arguments failed: {failure(exc)}") from exc
    if obj is None:
        raise UsageError(f"{spec} is None (a function that returns nothing?): there is nothing to check")
    if isinstance(obj, Target):
        return obj
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[1], (tuple, dict)):
        inputs = obj[1]
        if isinstance(inputs, dict):
            return Target(obj[0], (), dict(inputs))
        return Target(obj[0], tuple(inputs), {})
    return obj


def failure(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r})"
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


def resolve_target(spec: str) -> Any:
    """A TARGET from the command line: an existing path is returned as a path string (a checkpoint)."""
    if os.path.exists(spec):
        return spec
    return load_target(spec)


def parse_common(args: argparse.Namespace) -> tuple[Any, Any]:
    """``--device`` / ``--dtype`` parsed, with usage errors instead of tracebacks."""
    from torchdoctor._report import parse_device, parse_dtype

    try:
        device = parse_device(args.device) if getattr(args, "device", None) else None
        dtype = parse_dtype(args.dtype) if getattr(args, "dtype", None) else None
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if dtype is not None and not (dtype.is_floating_point or dtype.is_complex):
        raise UsageError(f"--dtype {args.dtype}: a floating dtype is expected (e.g. bfloat16, float16, float32); "
                         "integer and bool tensors are never cast or judged by dtype")
    return device, dtype


def print_json(doc: Any) -> None:
    import json

    json.dump(doc, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
