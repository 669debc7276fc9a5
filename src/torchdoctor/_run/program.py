"""Run an unmodified program as ``python script.py ARGS`` / ``python -m module ARGS`` would, watched.

The program sees its own ``sys.argv``, the current directory it was started in, ``__name__ == "__main__"`` and
``sys.path[0]`` (the script's folder, or the current directory for ``-m``). Its exit code passes through:
``sys.exit(3)`` is 3, an uncaught exception prints its traceback and is 1, ``sys.exit`` in a thread ends only that
thread (as in Python). With ``device`` the whole program runs on virtual devices (``torchdoctor.virtual_devices``)
and the placement problems the virtual run recorded join the findings.
"""

from __future__ import annotations

import contextlib
import logging
import os
import runpy
import sys
import time
import traceback
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torchdoctor._run.raised import keep, raised
from torchdoctor._run.threadend import join_program_threads, threads_now
from torchdoctor._run.watch import Finding, Located, Watcher, first_own_frame

if TYPE_CHECKING:
    from torchdoctor._run.runreport import RunReport


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"), as python prints it
    return 1


_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the torchdoctor package folder
_VIRTUAL = os.path.join(_OURS, "_virtual") + os.sep


def print_program_error(exc: BaseException) -> None:
    """The program's error as python prints it, without torchdoctor's frames: those before the program's first
    frame (runpy, this runner) and those between the program's own (the virtual devices' wrappers of a backward or
    a factory). Frames after the program's last one stay: an error raised inside torchdoctor is shown where."""
    try:
        te = traceback.TracebackException(type(exc), exc, _own_traceback(exc))
        seen: set[int] = set()
        cur: traceback.TracebackException | None = te
        while cur is not None and id(cur) not in seen:  # each chained exception's frames too
            seen.add(id(cur))
            frames = list(cur.stack)
            last = max((i for i, f in enumerate(frames) if not f.filename.startswith(_OURS)), default=-1)
            # after the program's last frame the virtual devices' own frames stand for torch's kernels, which
            # python never shows: the traceback ends at the program's line, as on the real device
            kept = [f for i, f in enumerate(frames) if not f.filename.startswith(_VIRTUAL if i > last else _OURS)]
            if len(kept) != len(frames):
                cur.stack = traceback.StackSummary.from_list(kept)
            cur = cur.__cause__ or cur.__context__
        sys.stderr.write("".join(te.format()))
    except Exception:  # never lose the program's error over how it is shown
        traceback.print_exception(type(exc), exc, _own_traceback(exc))


def _own_traceback(exc: BaseException) -> Any:
    """The traceback from the first frame that is not torchdoctor's or runpy's (what python would print)."""
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_globals.get("__name__") or ""
        if not (name.startswith("torchdoctor") or name in ("runpy", "contextlib")):
            return tb
        tb = tb.tb_next
    return exc.__traceback__


def path0(script: str) -> str:
    """``sys.path[0]`` as python sets it for ``python SCRIPT``: a folder or zip archive with ``__main__.py`` is
    itself the entry, a file's folder otherwise."""
    import pkgutil

    full = os.path.abspath(script)
    return full if os.path.isdir(full) or pkgutil.get_importer(full) is not None else os.path.dirname(full)


def _not_found(exc: BaseException) -> bool:
    """``-m NAME`` that names no runnable module: runpy raised it before any of the program's code ran."""
    if not isinstance(exc, ImportError):
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_globals.get("__name__") == "runpy"


def execute(script: str | None, module: str | None, args: list[str], watcher: Watcher) -> int:
    """Run the program in this process; its exit code. Exceptions that end it are explained first."""
    saved_argv, saved_path, saved_main = sys.argv, list(sys.path), sys.modules.get("__main__")
    if module is not None:
        sys.argv = [module, *args]  # runpy sets argv[0] to the module's file, as python -m does
        sys.path.insert(0, os.getcwd())
    else:
        assert script is not None
        sys.argv = [script, *args]
        sys.path.insert(0, path0(script))
    try:
        if module is not None:
            watcher.names = runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            watcher.names = runpy.run_path(script or "", run_name="__main__")
        return 0
    except SystemExit as exc:
        watcher.names = _names_at(exc)
        return _exit_code(exc.code)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the program's own error: explained, and shown as python would show it
        watcher.names = _names_at(exc)
        if _stopped(exc):
            raise
        if module is not None and _not_found(exc):  # one line, as `python -m NAME` prints it
            watcher.missing = f"{sys.executable}: {exc}"
            print(watcher.missing, file=sys.stderr)
            return 1
        watcher.see("raised", exc)
        keep(watcher, exc)
        print_program_error(exc)
        return 1
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        if saved_main is not None:
            sys.modules["__main__"] = saved_main


def _names_at(exc: BaseException) -> dict[str, Any]:
    """The program's names where it ended with ``exc``, which its fixes are written with (loaded only then)."""
    from torchdoctor._run.names import program_names

    return program_names(exc)


def _stopped(exc: BaseException) -> bool:
    """The virtual run's own stop (not an error of the program): the session ends there and says why."""
    return type(exc).__name__ == "_Stop" and type(exc).__module__.startswith("torchdoctor.")


def run(script: str | None = None, args: list[str] | None = None, *, module: str | None = None,
        device: str | None = None, dtype: Any = None, profile: Any = None, mode: str = "explain",
        trace: bool = True, sources: dict[str, str] | None = None, count: int | None = None) -> RunReport:
    """Run a program watched (the CLI's ``torchdoctor run``); with ``device``, on virtual devices (``count`` of its
    kind). ``sources``: where device/dtype/profile came from (``--device``), said in the report."""
    from torchdoctor._guard.api import guard

    args = list(args or [])
    program = ["-m", module, *args] if module else [script or "", *args]
    watcher = Watcher(root=path0(script) if script else os.getcwd())
    pid = os.getpid()
    start = time.perf_counter()
    session: Any = None
    code, notes = 1, {}  # a virtual run that stops early (backward(), an op it cannot simulate) ends the program
    internal: list[str] = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(_internal_notes(internal))
        if device is not None:
            from torchdoctor._virtual.session import virtual_devices

            session = stack.enter_context(virtual_devices(device, dtype, profile=profile, count=count,
                                                          raise_on_exit=False))
        if trace:
            from torchdoctor._trace.api import trace as trace_

            stack.enter_context(trace_(None, logger=_quiet_logger()))
        g = guard(None, mode=mode)
        g.problems = Located(g.problems, watcher.root)  # each problem guard records keeps the program's line
        watcher.guard = g
        watcher.install()
        stack.callback(watcher.uninstall)
        from torchdoctor._run.warned import watched_warnings

        stack.enter_context(watched_warnings(watcher))  # a warning that says the step runs otherwise (autocast off)
        try:
            before = threads_now()
            with g:
                code = execute(script, module, args, watcher)
            join_program_threads(before)  # Python waits for them before it exits; the summary waits too
        except BaseException as exc:  # guard re-raised the program's error as a PlacementError
            if isinstance(exc, KeyboardInterrupt) or _stopped(exc):
                raise
            watcher.see("raised", exc)
            keep(watcher, exc)
            print_program_error(exc)
            code = 1
        watcher.guarded(g)  # what guard recorded and no error named: swallowed, or aligned by fix / warn
        notes = _notes(session, trace)  # while the trace is active
    if os.getpid() != pid:  # a process the program forked ends here, as under python: no second summary
        raise SystemExit(code)
    _guard_fixes_as_held(watcher.findings, watcher.names)
    from torchdoctor._run.runreport import RunReport  # the report's machinery: once the program ended

    if session is None:
        report = RunReport(program, code, [_virtual_advice(f, program) for f in watcher.findings],
                           seconds=time.perf_counter() - start, missing=watcher.missing)
        report.internal = internal
        report.raised = raised(watcher, False) if report.ok and code != 0 else None
        return report
    kind = session.device.type
    watcher.findings[:] = [_other_kind_advice(f, kind) for f in watcher.findings]
    fixes = tuple(session.fixes)
    if fixes:  # the fixes' names and labels: loaded only for a run that has fixes
        from torchdoctor._run.names import as_held
        from torchdoctor._run.rerun import said_why_not

        fixes = as_held(said_why_not(fixes), _held(watcher.names))
    where = {key: first_own_frame(frames, watcher.root) for key, frames in session.stacks.items()}
    report = RunReport(program, code, watcher.findings, list(session.problems), str(session.device),
                       time.perf_counter() - start, session.stopped, where, notes,
                       _expected(session, profile, sources or {}), watcher.missing, session.where_ran(),
                       session.networks, fixes)
    report.internal = internal
    report.raised = raised(watcher, True) if report.ok and code != 0 else None
    if report.problems:  # the models the problems are in, by name: one model's tensors are one cause
        report.roots = _roots(session)
        from torchdoctor._run.offhook import hook_notes

        report.hooks = hook_notes(report.problems, list(getattr(session.problems, "roots", None) or ()))
    return report


def _roots(session: Any) -> list[tuple[str, frozenset[str], frozenset[str]]]:
    import torch

    out = []
    for m in list(getattr(session.problems, "roots", None) or ())[:16]:
        if isinstance(m, torch.nn.Module):
            held = [*m.named_parameters(remove_duplicate=False), *m.named_buffers(remove_duplicate=False)]
            # (and the devices they are on at the end: a model moved away whole is told from one a move missed)
            out.append((type(m).__name__, frozenset(n for n, _ in held), frozenset(str(t.device) for _, t in held)))
    return out


def _guard_fixes_as_held(findings: list[Finding], names: dict[str, Any] | None) -> None:
    """guard's fixes (``model[2].weight.data = ...``) written with the names the program holds (``merged[2]...``);
    explain's catalogue advice is generic and stays as it is."""
    if not any(f.fix and f.fix_from == "guard" for f in findings):
        return
    from torchdoctor._run.names import held_code

    held = _held(names)
    for f in findings:
        if f.fix and f.fix_from == "guard":
            f.fix = held_code(f.fix, held)


def _held(names: dict[str, Any] | None) -> dict[str, Any]:
    """The program's module globals, then the modules its functions held by name when their forwards started
    (``net`` of ``def main(): net = build()``, gone with ``main``'s frame when the program ends)."""
    from torchdoctor._tracker import held_names

    out = dict(names or {})
    for name, mod in held_names().items():
        out.setdefault(name, mod)
    return out


def _virtual_advice(f: Finding, program: list[str]) -> Finding:
    """A program that asks for hardware this machine lacks ("Torch not compiled with CUDA enabled"): the first
    advice is to run it here on a virtual device of that kind (``--device``); installing a build comes after. The
    module guard saw last is no culprit of a missing device."""
    if f.category != "no_accelerator":
        return f
    text = f.error.lower()
    kind = "xpu" if "xpu" in text else "mps" if "mps" in text else "cuda:0"
    import shlex

    line = f"torchdoctor run --device {kind} {shlex.join(program)}  # its placement checked on a virtual {kind} here"
    f.fix = line + (f"\n# or, to run it for real on this machine's hardware:\n{f.fix}" if f.fix else "")
    f.culprit = None
    return f


def _other_kind_advice(f: Finding, kind: str) -> Finding:
    """A virtual run on ``kind`` (xpu, mps) where the program asks for another kind of device this build lacks
    ("Torch not compiled with CUDA enabled", as on an Intel GPU or a Mac): the fix is the machine's own device, not
    another torch build."""
    if f.category != "no_accelerator":
        return f
    text = f.error.lower()
    asked = next((k for k in ("cuda", "xpu", "mps") if k in text), None)
    if "requires cuda support" in text or "dummy base class" in text:  # a CUDA-only stream API: no tensor is the
        f.culprit = None  # culprit, and its fix is the same streams and events for every device (explain's)
        return f
    if asked is None or asked == kind:
        return f
    f.fix = (f"device = torch.accelerator.current_accelerator()  # {kind} on this machine, {asked} where there is one\n"
             f"# then .to(device) / device=device where the program names '{asked}'"
             + (f" ({f.where})" if f.where else ""))
    f.culprit, f.fix_from = None, "run"
    return f


def _expected(session: Any, profile: Any, sources: dict[str, str]) -> dict[str, str]:
    """What the virtual run judged against, each with where it came from (as scan and simulate say it)."""
    from torchdoctor._placement import device_str, dtype_str

    out = {"device": f"{device_str(session.device)} (from {sources.get('device', 'the device= argument')})"}
    if session.dtype is not None:  # parsed by the session: "bf16" reads bfloat16, as everywhere else
        out["dtype"] = f"{dtype_str(session.dtype)} (from {sources.get('dtype', 'the dtype= argument')})"
    name = getattr(profile, "name", profile)
    out["profile"] = (f"{name} (from {sources.get('profile', 'the profile= argument')})" if profile is not None
                      else f"the default profile of {session.device.type}")
    return out


def _notes(session: Any, traced: bool) -> dict[str, str]:
    """Each problem's last change: the trace's record, or the virtual run's own when it is newer (a copy the
    program's line took back to the cpu, ``qs.code = qs.code.cpu()``, which no trace of the model records)."""
    if session is None or not session.problems:
        return {}
    changes = session.changes
    if traced:
        from torchdoctor._trace.api import record_for
    out = {}
    for p in session.problems:
        if not p.path or p.path.startswith("<"):
            continue
        root = p.module_type if p.module_path == "" else None  # the object's own record, not another's path
        rec = record_for(p.path, root) if traced else None
        mine = changes.get(p.path)
        if mine is not None and (rec is None or rec.time < mine[1]):
            out[p.path] = mine[0]
        elif rec is not None:
            out[p.path] = rec.note()
    return out


class _Notes(logging.Handler):
    """Keeps torchdoctor's own warnings as one line each (the exception's type and first line, never its
    traceback): the program's output is the program's."""

    def __init__(self, notes: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.notes = notes

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage().removeprefix("torchdoctor.trace: ")
            if record.exc_info and record.exc_info[1] is not None:
                exc = record.exc_info[1]
                text += f" ({type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]})"
        except Exception:  # a record that does not format: said without its text
            text = f"{record.name}: an internal warning"
        if text not in self.notes and len(self.notes) < 8:
            self.notes.append(text)


@contextlib.contextmanager
def _internal_notes(notes: list[str]) -> Iterator[None]:
    """While the program runs, torchdoctor's loggers (a walk that cannot read an object, a trace that cannot look at
    a state) report into ``notes`` instead of the program's logging configuration or Python's last-resort handler."""
    logger = logging.getLogger("torchdoctor")
    saved = logger.propagate
    handler = _Notes(notes)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = saved


def _quiet_logger() -> Any:
    """The trace records for the report, without a log line per move."""
    logger = logging.getLogger("torchdoctor.run.trace")
    logger.propagate = False
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):  # once, however many runs
        logger.addHandler(logging.NullHandler())
    return logger
