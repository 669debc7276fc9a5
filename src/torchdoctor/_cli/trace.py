"""``torchdoctor trace [--moves] [--lora] [--file OUT] SCRIPT ARGS...``: run an unmodified script and record every
device/dtype change of the modules it moves, with the call and the line that made it.

What is recorded comes from ``--moves`` / ``--lora``, else from ``TORCHDOCTOR_TRACE`` (``moves``, ``lora`` or
``moves,lora``), else moves. Records go to standard error (one line each) and, with ``--file``, to a JSON lines
file. The exit code is the script's own; a script that does not exist is a usage error (2).
"""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import sys
import traceback
import types

from torchdoctor._cli.child import ProgramSignals
from torchdoctor._cli.common import UsageError

ENV = "TORCHDOCTOR_TRACE"
_WORDS = {"moves": (True, False), "lora": (False, True), "all": (True, True)}


def selection(moves: bool, lora: bool, env: str | None) -> tuple[bool, bool]:
    """(moves, lora) from the flags, else from the environment variable's words, else moves only.

    >>> selection(False, False, "moves,lora"), selection(False, True, "moves"), selection(False, False, None)
    ((True, True), (False, True), (True, False))
    """
    if moves or lora:
        return moves, lora
    if not env or not env.strip():
        return True, False
    out = [False, False]
    for word in env.replace(" ", ",").split(","):
        if not word:
            continue
        hit = _WORDS.get(word.strip().lower())
        if hit is None:
            raise UsageError(f"{ENV}={env!r}: unknown word {word!r}; use moves, lora or moves,lora")
        out = [out[0] or hit[0], out[1] or hit[1]]
    return out[0], out[1]


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _script_traceback(exc: BaseException, script: str) -> types.TracebackType | None:
    """The traceback from the script's own first frame on (torchdoctor's and runpy's frames left out)."""
    tb = exc.__traceback__
    target = os.path.abspath(script)
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename) == target:
            return tb
        tb = tb.tb_next
    return exc.__traceback__


def _print_script_error(exc: BaseException, script: str) -> None:
    """The script's error as python prints it, without torchdoctor's frames (the trace's wrappers of ``Module.to``
    between the script's own)."""
    try:
        from torchdoctor._run.program import print_program_error

        print_program_error(exc)
    except Exception:  # never lose the script's error over how it is shown
        traceback.print_exception(type(exc), exc, _script_traceback(exc, script))


def no_device_hint(exc: BaseException, program: list[str]) -> str | None:
    """For a program that asks for hardware this machine's torch lacks ("Torch not compiled with CUDA enabled"):
    the line that runs it here on a virtual device of that kind, where ``run`` traces it too."""
    try:
        from torchdoctor._explain.api import explain

        found = explain(exc, limit=1)
    except Exception:  # a hint is extra
        return None
    if not found or found[0].category != "no_accelerator":
        return None
    import shlex

    text = str(exc).lower()
    kind = "xpu" if "xpu" in text else "mps" if "mps" in text else "cuda:0"
    return (f"this program asks for {kind.split(':')[0]}, which this machine's torch does not have: "
            f"`torchdoctor run --device {kind} {shlex.join(program)}` runs it here on a virtual {kind} "
            "and records its moves too")


def command(args: argparse.Namespace) -> int:
    script = args.script
    if not os.path.isfile(script):
        what = "is a directory" if os.path.isdir(script) else "does not exist"
        raise UsageError(f"the script {script!r} {what}; usage: torchdoctor trace [--moves] [--lora] [--file OUT] "
                         "SCRIPT [ARGS...]")
    moves, lora = selection(bool(args.moves), bool(args.lora), os.environ.get(ENV))
    out = getattr(args, "file", None)
    if out:
        try:
            open(out, "w", encoding="utf-8").close()
        except OSError as exc:
            raise UsageError(f"cannot write --file {out!r}: {exc.strerror or exc}") from exc

    from torchdoctor._trace.api import trace

    logger = logging.getLogger("torchdoctor.trace")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("torchdoctor trace: %(message)s"))
    saved_logger = (logger.level, logger.propagate, logger.disabled)
    if not getattr(args, "quiet", False):
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.disabled = False  # an earlier logging.config.dictConfig (disable_existing_loggers) must not mute the trace
    logger.propagate = False  # a script's own logging.basicConfig must not print every line twice
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [script, *(args.script_args or [])]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    code, pid, hint = 0, os.getpid(), None
    t = trace(None, moves=moves, lora=lora, file=out)
    try:
        with ProgramSignals("trace", 2), t:  # SIGTERM / SIGHUP end what the script started, then this
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the script's own error: shown as python would show it
        _print_script_error(exc, script)
        hint = no_device_hint(exc, [script, *(args.script_args or [])])
        code = 1
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        logger.removeHandler(handler)
        logger.setLevel(saved_logger[0])
        logger.propagate = saved_logger[1]
        logger.disabled = saved_logger[2]
        sys.stderr.flush()
    if os.getpid() != pid:  # a process the script forked ends here, as under python: no second summary
        raise SystemExit(code)
    shown = sum(1 for r in t.records if t.selected(r))
    where = f"; JSON lines in {out}" if out else ""
    print(f"torchdoctor trace: {shown} change(s) shown, {len(t.records)} recorded{where}", file=sys.stderr)
    if hint:  # the last line says what to do
        print(f"torchdoctor trace: {hint}", file=sys.stderr)
    if getattr(args, "json", False):
        from torchdoctor._cli.common import print_json
        from torchdoctor._report.text import schema

        sys.stdout.flush()  # after what the script printed
        print_json({"schema": schema("trace"), "script": script, "exit_code": code,
                    "changes": [r.to_dict() for r in t.records if t.selected(r)], "recorded": len(t.records)})
    return code
