"""Command line: ``torchdoctor scan|simulate|explain|env|trace|demo|run``.

Each verb's command lives in its own module here and exposes ``command(args) -> int``; this module only parses
arguments and turns bad input into one clear line and exit code 2 (never a traceback). The verbs never import
the command line. Nothing here imports torch: ``scan`` of checkpoint files runs without it.

From the real command line, verbs that run the user's code (``scan``/``simulate`` of ``file.py:name``) run in a
child process (``run_in_child`` in ``_cli/common.py``): a TARGET that calls ``os._exit`` or outlives ``--timeout`` ends the child,
not the verdict, and the parent prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

from torchdoctor._cli.child import child_exit, child_role, run_in_child
from torchdoctor._cli.common import UsageError, positive_float, positive_int
from torchdoctor._report.terminal import output_width, set_color
from torchdoctor._report.text import EXIT_USAGE, line_width


def _version() -> str:
    from importlib import metadata

    from torchdoctor import __version__

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "not installed"
    return f"torchdoctor {__version__} (torch {torch_version}, Python {sys.version.split()[0]})"


class _VersionAction(argparse.Action):
    """``--version``, its text built only when asked: ``importlib.metadata`` costs more than a whole checkpoint
    scan, and every other command line would pay it while the parser is built."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show the version of torchdoctor, torch and Python, then exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(_version())
        parser.exit()


def _columns() -> int:
    """``shutil.get_terminal_size().columns`` without importing shutil (it imports bz2, lzma and zlib)."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _Formatter(argparse.HelpFormatter):
    """argparse's help layout; the width computed as argparse computes it, but without ``import shutil`` (argparse
    builds a formatter for every argument it adds)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, _columns() - 2 if width is None else width)


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line (``torchdoctor simulate: argument --count: ...``), exit code 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        from torchdoctor._cli.hints import with_hint

        tolerant_streams()  # the command ends here: an argument in another script must not fail the message
        prog = self.prog
        verb = getattr(self, "verb_word", None)  # argparse reports a verb's unknown options from the top parser
        if verb and message.startswith("unrecognized arguments"):
            prog = f"{prog} {verb}"
        self.exit(EXIT_USAGE, f"{prog}: {with_hint(self, message)}\n")


def _parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line; with ``only``, just that verb's subcommand (what ``torchdoctor VERB ...`` parses: the
    other verbs' subparsers cost more than reading a small checkpoint). Help and errors read the same."""
    p = _Parser(
        prog="torchdoctor",
        description="Find, explain and fix device and dtype placement bugs in PyTorch. Start with `torchdoctor run "
                    "app.py` (your program, watched), `torchdoctor run --device cuda app.py` (on a virtual GPU, none "
                    "needed here) or `torchdoctor demo`.",
        epilog="`torchdoctor help VERB` (or VERB --help) shows a verb's options. "
               "Exit codes: 0 nothing found, 1 problems found, 2 bad usage or cannot check. Defaults for "
               "--device, --dtype, --profile, --assume-device and --limit come from [tool.torchdoctor] in the "
               "nearest pyproject.toml.",
    )
    p.add_argument("--version", action=_VersionAction)
    sub = p.add_subparsers(dest="verb", metavar="VERB")
    shared = _Parser(add_help=False)
    shared.add_argument("--color", choices=("auto", "always", "never"), default=None,
                        help="colour the output: auto (a terminal, unless NO_COLOR is set; FORCE_COLOR forces it, "
                             "e.g. in CI logs), always or never")
    for verb, add in _BUILDERS.items():
        if only is None or only == verb:
            add(sub, shared)
    if only is None or only not in _BUILDERS:
        _optional_verbs(sub, shared)
    return p


def _quiet(shared: argparse.ArgumentParser, what: str = "no progress line on stderr") -> argparse.ArgumentParser:
    """The options every verb takes: ``--color`` (from ``shared``) and ``-q`` (what it silences: ``what``)."""
    quiet = _Parser(add_help=False, parents=[shared])
    quiet.add_argument("-q", "--quiet", action="store_true", help=what)
    return quiet


def _limit() -> argparse.ArgumentParser:
    limit = _Parser(add_help=False)
    limit.add_argument("--timeout", type=positive_float, default=None, metavar="SECONDS",
                       help="stop a TARGET that is still loading or running after SECONDS (exit 2)")
    return limit


def _add_scan(sub: Any, shared: argparse.ArgumentParser) -> None:
    s = sub.add_parser("scan", parents=[_quiet(shared), _limit()],
                       help="list tensors on the wrong device/dtype, by path (objects, checkpoint files, dirs)")
    s.add_argument("target", metavar="TARGET", nargs="+",
                   help="checkpoint file or dir, or path/to/file.py:name, or package.module:name (several allowed)")
    s.add_argument("--device", help="expected device, e.g. cuda:0 (for a checkpoint: where it would load)")
    s.add_argument("--dtype", help="expected floating dtype, e.g. bfloat16")
    s.add_argument("--json", action="store_true", help="print the report as JSON (a list of reports for several TARGETs)")
    s.add_argument("--html", metavar="FILE", help="write the device map (one self-contained HTML page) to FILE")
    s.add_argument("--plan", action="store_true", help="list what torchdoctor.move would do (needs --device or --dtype)")
    s.add_argument("--limit", type=positive_int, default=None, metavar="N",
                   help="rows shown per section in text output (default 40)")
    s.add_argument("--distributed", action="store_true",
                   help="under torchrun: every rank scans, rank 0 prints one report of all ranks")


def _add_simulate(sub: Any, shared: argparse.ArgumentParser) -> None:
    m = sub.add_parser("simulate", parents=[_quiet(shared), _limit()],
                       help="would TARGET run on cuda:N / xpu / mps? (no hardware needed)")
    m.add_argument("target", metavar="TARGET", nargs="*", help="path/to/file.py:name or package.module:name (several allowed)")
    m.add_argument("--device", help="the virtual device, e.g. cuda:1, mps, xpu (default: the profile's type); or cpu "
                   "with --dtype: that dtype checked on this CPU for real")
    m.add_argument("--dtype", help="the dtype the model should compute in there, e.g. bfloat16 (judged by the rules)")
    m.add_argument("--profile", metavar="NAME",
                   help="device preset: t4, v100, a100, h100, l4, rtx3090, rtx4090, m1, m2, m3, arc, cpu ... "
                        "(`--profile help` lists them)")
    m.add_argument("--assume-device", dest="assume_device", metavar="DEVICE", help="treat tensors on meta as holding data on this device; 'off' checks them as missing "
                   "(default: a model whose parameters are all on meta is taken as loaded on --device)")
    m.add_argument("--data", choices=("meta", "cpu"), default=None,
                   help="where the virtual tensors keep values: meta (the default, as simulate(): weights cost no "
                        "memory, a model built on meta checks in seconds) or cpu (real values, for a TARGET whose "
                        "forward steers on large tensors' values)")
    m.add_argument("--count", type=positive_int, default=None, metavar="N",
                   help="number of virtual devices (default: enough for --device)")
    m.add_argument("--limit", type=positive_int, default=None, metavar="N", help="problems shown in text output (default 40)")
    m.add_argument("--json", action="store_true",
                   help="print the report as JSON (schema torchdoctor/simulate/1; a list for several TARGETs)")
    m.add_argument("--html", metavar="FILE", help="write the device map of the problems found to FILE")
    m.add_argument("--distributed", action="store_true",
                   help="under torchrun: every rank simulates on virtual cuda:LOCAL_RANK, rank 0 prints one report")


def _add_explain(sub: Any, shared: argparse.ArgumentParser) -> None:
    e = sub.add_parser("explain", parents=[_quiet(shared)], help="explain a device/dtype error message or a whole log")
    e.add_argument("file", nargs="?", default="-", metavar="FILE", help="log file, or - for standard input (default)")
    e.add_argument("--json", action="store_true", help="print the diagnoses as JSON (schema torchdoctor/explain/1)")


def _add_env(sub: Any, shared: argparse.ArgumentParser) -> None:
    v = sub.add_parser("env", parents=[_quiet(shared)], help="environment doctor: torch build, drivers, IPEX/bnb conflicts, device choice")
    v.add_argument("--json", action="store_true",
                   help="print the facts and findings as JSON (schema torchdoctor/env/1; --facts reads it back)")
    v.add_argument("--facts", metavar="FILE", help="diagnose facts saved by `torchdoctor env --json` (offline)")
    v.add_argument("--probe", action="store_true", help="also ask torch's device APIs (may initialise a device)")
    v.add_argument("--markdown", action="store_true", help="print a Markdown block to paste into a bug report")


def _add_trace(sub: Any, shared: argparse.ArgumentParser) -> None:
    t = sub.add_parser("trace", parents=[_quiet(shared, "no line per change on stderr (--file still gets them); "
                                                            "the closing count stays")],
                       help="run a script and record every device/dtype change of its tensors, with the call and line",
                       epilog="Exit codes: the script's own, as `python SCRIPT` would give it (0 when it returns, "
                              "sys.exit's code, 1 for an uncaught exception after its traceback or for sys.exit with "
                              "a message); the changes recorded never set it. 2 for bad usage (no such script, "
                              "--file not writable).")
    t.add_argument("--moves", action="store_true", help="record moves and casts (default when neither is given)")
    t.add_argument("--lora", action="store_true", help="record LoRA load/fuse/unfuse/unload and adapter changes")
    t.add_argument("--file", metavar="OUT", help="also write JSON lines to OUT")
    t.add_argument("--json", action="store_true",
                   help="print the changes as one JSON document on stdout when the script ends (schema "
                        "torchdoctor/trace/1), after whatever the script printed")
    t.add_argument("script", metavar="SCRIPT", help="the Python script to run (as `python SCRIPT ARGS...` would)")
    t.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's own arguments")


def _add_demo(sub: Any, shared: argparse.ArgumentParser) -> None:
    d = sub.add_parser("demo", parents=[_quiet(shared)], help="diagnose and fix a small broken model (a diffusers UNet when "
                                                       "diffusers and peft are installed, else a plain torch model)")
    d.add_argument("--json", action="store_true", help="print the demo's findings as JSON (schema torchdoctor/demo/1)")
    d.add_argument("--plain", action="store_true", help="the torch-only model even when diffusers is installed")


_BUILDERS = {"scan": _add_scan, "simulate": _add_simulate, "explain": _add_explain, "env": _add_env,
             "trace": _add_trace, "demo": _add_demo}  # in the order --help lists them


def _optional_verbs(sub: Any, shared: argparse.ArgumentParser) -> None:
    """Verbs whose module may not be installed yet in this tree (``run``): wired when present, with the options
    every verb takes (``--color``)."""
    for verb in _OPTIONAL:
        try:
            module = importlib.import_module(_VERB_MODULES[verb])
        except ImportError:
            continue
        add = getattr(module, "add_parser", None)
        if add is not None:  # -q there: run draws no progress line, and one command line fits every verb
            add(sub, [_quiet(shared, "accepted on every verb; run draws no progress line (its summary stays)")])


_VERB_MODULES = {
    "scan": "torchdoctor._cli.scan",
    "simulate": "torchdoctor._cli.simulate",
    "explain": "torchdoctor._cli.explain",
    "env": "torchdoctor._cli.env",
    "demo": "torchdoctor._cli.demo",
    "trace": "torchdoctor._cli.trace",
    "run": "torchdoctor._cli.run",
}
_OPTIONAL = ("run",)
_ISOLATED = ("scan", "simulate")  # verbs that run a TARGET's code (``run`` watches a whole program itself)


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


def _all_paths(targets: Sequence[str]) -> bool:
    """Every TARGET is an existing file or directory that is not Python source: checkpoints only, no user code
    runs and torch is never imported (``my_app.py`` goes on to TARGET resolution, which says what to type)."""
    return bool(targets) and all(os.path.exists(t) and not t.endswith(".py") for t in targets)


def _checkpoint_command(args: argparse.Namespace) -> Any:
    """``torchdoctor._cli.checkpoint.command`` when that module has it (checkpoints read without torch)."""
    try:
        module = importlib.import_module("torchdoctor._cli.checkpoint")
    except ImportError:
        return None
    return getattr(module, "command", None)


def _runs_user_code(args: argparse.Namespace) -> bool:
    if args.verb not in _ISOLATED or getattr(args, "distributed", False):
        return False
    if args.verb == "simulate" and getattr(args, "profile", None) in ("help", "list"):
        return False
    return not _all_paths(list(args.target or []))


def _refused(args: argparse.Namespace) -> bool:
    """An output of this command line is one of its inputs: one line, never written to a stream that is one."""
    from torchdoctor._cli.paths import StreamClash, refuse_overwrites

    try:
        refuse_overwrites(args)
    except UsageError as exc:
        bad = exc.fds if isinstance(exc, StreamClash) else frozenset()
        stream = sys.stderr if 2 not in bad else sys.stdout if 1 not in bad else None
        if stream is not None:
            print(f"torchdoctor {args.verb}: {exc}", file=stream)
        return True
    return False


def tolerant_streams() -> None:
    """Standard output and error that never fail on a character their encoding lacks (``PYTHONIOENCODING=ascii``,
    a C locale, a tensor named in another script, a file name that is not UTF-8): escaped, as Python's own
    stderr does. ``run`` and ``trace`` call it only once the program ended, which keeps python's behaviour."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) == "strict":
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # closed, or a stream that cannot change
                pass


def main(argv: Sequence[str] | None = None) -> int:
    # torch's import warns when numpy is not installed ("Failed to initialize NumPy"): torchdoctor needs no numpy,
    # and that warning would be the first line a new user sees (`torchdoctor demo` with torch alone)
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    child = child_role()
    words = sys.argv[1:] if argv is None else list(argv)
    if not words or words[0] not in ("run", "trace"):  # those two leave the program's streams as python would
        tolerant_streams()
    if words and words[0] == "help":  # `torchdoctor help [VERB]`, as git and pip spell it
        from torchdoctor._cli.hints import help_command

        return help_command(words, list(_VERB_MODULES), main)
    # only the verb's own subparser (`run` too): argparse asks gettext for every parser's texts, and all the
    # verbs' parsers cost a `run` a sizeable part of its start (issue 43 point 4)
    parser = _parser(words[0] if words and words[0] in _VERB_MODULES else None)
    if words and words[0] in _VERB_MODULES:
        parser.verb_word = words[0]  # type: ignore[attr-defined]
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse printed the usage error (or --help / --version): a code, not an exit
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if not args.verb:
        parser.print_help()
        return EXIT_USAGE
    if getattr(args, "color", None):
        set_color(args.color)
    if args.verb == "simulate" and not args.target and getattr(args, "profile", None) not in ("help", "list"):
        print("torchdoctor simulate: the following arguments are required: TARGET", file=sys.stderr)
        return EXIT_USAGE
    if not child and _refused(args):
        return EXIT_USAGE
    if argv is None and not child and _runs_user_code(args):
        sys.stdout.flush()
        return run_in_child(sys.argv[1:], args.verb, (args.target or ["TARGET"])[0], getattr(args, "timeout", None))
    code = _command(args)
    if child:
        child_exit(code)
    return code


def _command(args: argparse.Namespace) -> int:
    real, out = sys.stdout, _Stdout(sys.stdout)
    sys.stdout = out  # type: ignore[assignment]
    try:
        if args.verb in ("scan", "simulate"):
            from torchdoctor._cli.config import apply_config

            apply_config(args)
        handler = _checkpoint_command(args) if args.verb == "scan" and _all_paths(args.target) \
            and not getattr(args, "distributed", False) else None
        if handler is None:
            handler = importlib.import_module(_VERB_MODULES[args.verb]).command
        with line_width(output_width(real)):
            code = int(handler(args))
    except UsageError as exc:
        tolerant_streams()  # `run` / `trace` too: the command ends with this line
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
