"""Every placement error a program raises, catches or only logs, explained once.

Apps catch their users' errors themselves: ComfyUI's executor logs "!!! Exception during processing !!!" with the
traceback through ``logging``, SD.Next logs them, a script may ``except Exception: log.exception(...)``; an excepthook
never sees those. So a ``Watcher`` listens where errors end up: every log record of every logger (one with
``exc_info``, or whose text is an error message; read in ``Logger.handle``, so the program's own logging configuration
is untouched), ``sys.excepthook`` and ``threading.excepthook``, and the exception that ends the program. Each distinct
error (its category and first line) becomes one ``Finding``: the explanation (``torchdoctor.explain``), guard's
culprit when guard watched the thread that raised it, the last move or cast of that tensor when a trace recorded it,
and the first frame in the user's or plugin's own code.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import traceback
import types
from typing import Any

from torchdoctor._run.printed import handling, unwrap, wrap

# frames in these folders are a plugin's, whatever app loaded them: ComfyUI custom nodes, SD.Next / A1111 / Forge
# extensions, InvokeAI nodes
PLUGIN_DIRS = ("custom_nodes", "extensions", "extensions-builtin", "nodes")


# The classes of this module and program.py are plain classes, not dataclasses: a dataclass compiles its methods
# with exec() when the module is imported, and these modules are imported before the program's first line (issue 43
# point 4: run adds < 50 ms to a program's start; three dataclasses cost ~3-5 ms of it).
class Finding:
    """One distinct placement error: how the program met it (``raised``, ``logged``, ``thread``), the explanation,
    where in the user's or plugin's code it came from, and what a trace knows of the tensor."""

    def __init__(self, how: str, error: str, category: str, title: str, fix: str | None, where: str | None,
                 culprit: str | None = None, trace: str | None = None, count: int = 1) -> None:
        self.how = how
        self.error = error  # ``RuntimeError: Expected all tensors ...`` (first line)
        self.category = category
        self.title = title
        self.fix = fix
        self.where = where  # ``custom_nodes/pack/nodes.py:42 in run`` (relative to the program's folder)
        self.culprit = culprit  # guard's headline and culprit lines, when guard saw the error
        self.trace = trace
        self.count = count
        self.fix_from = "guard"  # "guard" (aimed at its culprit), "run" (the failing line's objects), "explain"
        self.diff: str | None = None  # guard's fix as a unified diff of the user's file (``git apply`` takes it)

    def __repr__(self) -> str:
        return f"Finding({self.category!r}, {self.error[:80]!r}, where={self.where!r}, count={self.count})"

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("how", "error", "category", "title", "fix", "fix_from", "diff", "where",
                                              "culprit", "trace", "count")}

    def text(self) -> str:
        lines = [f"[{self.category}] {self.error}" + (f"  (x{self.count})" if self.count > 1 else ""),
                 f"  {self.how}: {self.title}" if self.where is None and "--mode" in self.how else
                 f"  {self.how} at {self.where or 'an unknown line'}: {self.title}"]
        if self.culprit:
            lines += [f"  {line}" for line in self.culprit.split("\nFix:", 1)[0].splitlines()[:8]]
        if self.trace:
            lines.append(f"  last change: {self.trace}")
        if self.fix:
            lines += [_FIX_HEAD.get(self.fix_from, "  fix:"), *(f"    {line}" for line in self.fix.splitlines())]
        if self.diff:
            lines += ["  patch (git apply):", *(f"    {line}" for line in self.diff.splitlines())]
        return "\n".join(lines)


_FIX_HEAD = {"explain": "  fix (explain's advice for this message: this run named no culprit or maker to aim one at):"}


def _met_before(exc: BaseException) -> bool:
    """Was this exception, with this traceback, met already? Marked on the exception (its traceback's id is valid
    while the exception holds it); an exception that takes no attribute is never taken for a repeat."""
    mark = id(exc.__traceback__)
    try:
        if exc.__dict__.get("_torchdoctor_met") == mark:
            return True
        exc.__dict__["_torchdoctor_met"] = mark
    except Exception:  # noqa: BLE001 - an exception without a __dict__
        pass
    return False


def _was_met(exc: BaseException) -> bool:
    """``_met_before`` without marking: each line of a traceback being printed is not a new look at it."""
    return getattr(exc, "__dict__", {}).get("_torchdoctor_met") == id(exc.__traceback__)


def _parts(path: str) -> list[str]:
    return os.path.normcase(os.path.abspath(path)).replace("\\", "/").split("/")


def first_own_frame(frames: list[tuple[str, int, str]], root: str) -> str | None:
    """The frame to name, from ``(file, line, function)`` innermost last: the innermost frame of a plugin, else of
    the user's own code (not a library, not one of the app's helper packages), else any non-library frame."""
    from torchdoctor._trace.record import APP_HELPERS, LIBRARY_PACKAGES, short_file  # one list with trace's records

    root_parts = _parts(root)
    own: list[str] = []
    helpers: list[str] = []
    scripts: list[str] = []  # frames of files next to the program's own script: the user's lines
    for filename, line, func in frames:
        if filename.startswith("<") or "site-packages" in filename or "dist-packages" in filename:
            continue
        parts = _parts(filename)
        if any(p in LIBRARY_PACKAGES for p in parts[-3:-1]) or filename.startswith(sys.prefix) \
                or filename.startswith(getattr(sys, "base_prefix", sys.prefix)):
            continue
        inside = parts[:len(root_parts)] == root_parts
        rel = parts[len(root_parts):] if inside else parts[-2:]
        label = f"{short_file(filename)}:{line} in {func}"
        if any(p in PLUGIN_DIRS for p in rel[:-1]):
            return label
        if inside and len(rel) == 1:
            scripts.append(label)
        # an app's own packages (sd-scripts' library/ and networks/ next to the training script) are the app's
        (helpers if rel and (rel[0] in APP_HELPERS or inside) and len(rel) > 1 else own).append(label)
    return scripts[-1] if scripts else own[-1] if own else helpers[-1] if helpers else None


def _frames(tb: types.TracebackType | None) -> list[tuple[str, int, str]]:
    out = []
    while tb is not None:
        out.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb.tb_frame.f_code.co_name))
        tb = tb.tb_next
    return out


def _frames_of_text(text: str) -> list[tuple[str, int, str]]:
    return [(m.group(1), int(m.group(2)), m.group(3))
            for m in re.finditer(r'File "([^"]+)", line (\d+), in (\S+)', text)]


class Located(list):  # type: ignore[type-arg]
    """guard's own list of problems, each append noted with the program's line that was running (the first own
    frame, as every finding names it): a problem guard records and the program swallows still has its line."""

    def __init__(self, items: Any, root: str) -> None:
        super().__init__(items)
        self.root = root
        self.where: dict[tuple[Any, ...], str | None] = {}

    def _note(self, p: Any) -> None:
        try:
            from torchdoctor._report.text import call_stack

            frames = call_stack(sys._getframe(2))
            self.where.setdefault((p.kind, p.path, p.module_path, p.op), first_own_frame(frames, self.root))
        except Exception:  # a line is an extra: the problem itself is always kept
            pass

    def append(self, p: Any) -> None:
        self._note(p)
        super().append(p)

    def insert(self, i: Any, p: Any) -> None:  # guard keeps a problem in its place among those it replaces
        self._note(p)
        super().insert(i, p)


class Watcher:
    """Collects findings from the places errors end up; ``install`` / ``uninstall`` around a program."""

    def __init__(self, root: str | None = None, guard: Any = None) -> None:
        self.root = root if root is not None else os.getcwd()
        self.guard = guard  # a torchdoctor.guard active in the program's main thread, for its culprit
        self.missing: str | None = None  # `-m NAME` named no runnable module: python's one line, nothing ran
        self.names: dict[str, Any] = {}  # the program's module globals once it ended (its fixes use its names)
        self.findings: list[Finding] = []
        self._keys: dict[tuple[str, str, str], Finding] = {}
        self._lock = threading.Lock()
        self._saved: list[Any] = []
        self._streams: tuple[Any, Any] = (None, None)  # sys.stdout and sys.stderr as they were before ``install``
        self._last: tuple[str, str, str] | None = None  # the last exception's key, for the text record that logs it

    def see(self, how: str, exc: BaseException | None = None, text: str | None = None,
            site: str | None = None) -> Finding | None:
        """An error met by the program (an exception, or a logged message; ``site``: the line that logged it);
        None when it is not about placement."""
        try:
            return self._see(how, exc, text, site)
        except Exception:  # a diagnostic must not break the program it watches
            logging.getLogger("torchdoctor.run").debug("could not explain", exc_info=True)
            return None

    def _see(self, how: str, exc: BaseException | None, text: str | None, site: str | None) -> Finding | None:
        from torchdoctor._explain.api import explain

        seen: set[int] = set()
        if exc is not None:  # the placement error itself, where another one was raised from it
            cur: BaseException | None = exc
            while cur is not None and id(cur) not in seen:
                seen.add(id(cur))
                if type(cur).__name__ == "PlacementError":
                    exc = cur
                    break
                cur = cur.__cause__ or cur.__context__
        report = explain(exc if exc is not None else text or "", limit=1)
        if not report:
            return None
        d = report[0]
        first = (str(exc).strip().splitlines() or [""])[0] if exc is not None else \
            next((ln.strip() for ln in (text or "").splitlines()[::-1] if "Error" in ln), (text or "").strip()[:200])
        error = f"{type(exc).__name__}: {first}" if exc is not None else first
        said = (d.category, re.sub(r"^[\w.]*(Error|Exception)\w*: ", "", error)[:300])  # as raised or as logged
        frames = _frames(exc.__traceback__) if exc is not None else _frames_of_text(text or "")
        where = first_own_frame(frames, self.root) or site
        # the same error at the same place is one finding (counted); the same message raised at two places (two
        # nodes' "mat1 and mat2 ...") is two, each with its own line, culprit and fix
        key = (*said, where or "")
        # one exception met twice (logged with its traceback, then printed by the logger's formatter) is one: the
        # exception itself carries the mark (keeping it here would keep the program's frames alive; an id kept
        # here could be reused by the next exception and undercount a repeat)
        again = _met_before(exc) if exc is not None else False
        with self._lock:
            if exc is None and self._last is not None and self._last[:2] == said:  # a text record of the error
                self._last = None  # just met (its message logged after its traceback)
                return None
            self._last = key if exc is not None else None
            if (old := self._keys.get(key)) is not None:
                if not again:
                    old.count += 1
                return None
        from torchdoctor._run.evidence import aimed_fix, culprit_patch  # loaded with the first error, never before
        from torchdoctor._run import gendraw, loadfix
        from torchdoctor._run.offloaded import offloaded_read
        # an offloaded weight read on meta outside its forward; the culprit's fix; the line's objects; explain's last
        offloaded = offloaded_read(exc) if exc is not None and "meta" in first else None
        culprit: str | None
        fix: str | None
        culprit, fix, source = (*offloaded[:2], "run") if offloaded else \
            aimed_fix(self._culprit(exc), exc, d.fixes[0][1] if d.fixes else None)
        if source == "guard" and fix and exc is not None:  # the names the failing frames hold (a node's `net`)
            from torchdoctor._run.evidence import frame_names
            from torchdoctor._run.names import held_code

            fix = held_code(fix, frame_names(exc, self.root))
        finding = Finding(how, error[:500], d.category, d.title, fix, where, culprit, _trace_note(culprit))
        finding.fix_from, finding.diff = source, offloaded[2] if offloaded is not None else culprit_patch(culprit)
        loadfix.aim_load(finding, d.category, exc)  # storages for a missing GPU: at the program's torch.load line
        gendraw.aim_draw(finding, exc)  # a generator handed to a library call whose modules are on another device
        with self._lock:
            if key in self._keys:
                self._keys[key].count += 1
                return None
            self._keys[key] = finding
            self.findings.append(finding)
        return finding

    def _culprit(self, exc: BaseException | None) -> str | None:
        """Guard's explanation of this exception (its culprits by path), when guard can give one."""
        if exc is None:
            return None
        if type(exc).__name__ == "PlacementError":
            return str(exc)
        notes = [n for n in getattr(exc, "__notes__", ()) if "placement" in n.lower() or "culprit" in n.lower()]
        if notes:
            return notes[-1]
        if self.guard is None:
            return None
        from torchdoctor._guard.api import explain_running

        return explain_running(self.guard, exc)

    # -- where errors end up -------------------------------------------------------------------------------
    def install(self) -> None:
        watcher = self
        handle = logging.Logger.handle

        def logged(logger: logging.Logger, record: logging.LogRecord) -> Any:
            watcher.record(record)
            return handle(logger, record)

        # every record of every logger, before its handlers: a handler of our own on the root logger would make
        # the program's logging.basicConfig() a no-op (it configures only a root logger without handlers)
        logging.Logger.handle = logged  # type: ignore[method-assign,assignment]
        prev_sys, prev_thread = sys.excepthook, threading.excepthook

        def sys_hook(etype: type[BaseException], value: BaseException, tb: Any) -> None:
            watcher.see("raised", value)
            prev_sys(etype, value, tb)

        def thread_hook(args: Any) -> None:
            if args.exc_type is not SystemExit:
                watcher.see(f"raised in thread {getattr(args.thread, 'name', '?')}", args.exc_value)
            prev_thread(args)

        self._saved = [handle, prev_sys, prev_thread, *(getattr(traceback, n) for n in _PRINTERS)]
        sys.excepthook, threading.excepthook = sys_hook, thread_hook
        self._streams = wrap(lambda exc: None if _was_met(exc) else watcher.see("caught and printed", exc))
        for name in _PRINTERS:  # an error the program catches and prints (A1111 / Forge: traceback.print_exc())
            setattr(traceback, name, self._printer(getattr(traceback, name)))

    def _printer(self, original: Any) -> Any:
        """``original`` (a traceback printer or formatter) that first shows the watcher the exception it is given;
        its output is the original's."""
        watcher, busy = self, threading.local()

        def printer(*args: Any, **kwargs: Any) -> Any:
            if not getattr(busy, "on", False):
                busy.on = True
                try:
                    first = args[0] if args else kwargs.get("exc")
                    value = first if isinstance(first, BaseException) else \
                        (args[1] if len(args) > 1 else kwargs.get("value"))
                    if isinstance(value, BaseException):
                        watcher.see("caught and printed", value)
                finally:
                    busy.on = False
            return original(*args, **kwargs)

        return printer

    def guarded(self, g: Any) -> None:
        """What guard itself recorded (strict / fix / warn: problems it raised, aligned or warned of, with its
        maker, fix and proof) and no finding named yet: an error the program swallowed, or one guard fixed."""
        try:
            report = g.report()
        except Exception:
            return
        fixed = {f.path for f in report.fixes}
        located = g.problems.where if isinstance(g.problems, Located) else {}
        named = " ".join(f"{f.error} {f.culprit or ''}" for f in self.findings)
        said = {(f.category, f.fix) for f in self.findings if f.fix}  # an error's culprit list may end "and N more"
        for p in report.problems:
            note = report.note(p)
            if f"`{p.path}`" in named or f" {p.path} " in named or f" {p.path}:" in named \
                    or (f"{p.kind}_mismatch", note.fix) in said:  # one cause, one fix: the error's finding has it
                continue
            aligned = p.path in fixed
            how = f"aligned by --mode {report.mode}" if aligned else f"recorded by --mode {report.mode}"
            lines = [f"culprit {p.path} is {p.found}, expected {p.expected}"
                     + (f" (in `{p.module_path}` at {p.op})" if p.module_path else "")]
            if note.maker:
                lines.append(f"made {note.maker}")
            if note.proof:
                lines.append(note.proof)
            if aligned:
                lines.append("aligned for each call while the program ran; make the fix permanent")
            error = f"{p.kind} problem: {p.path} is {p.found}, expected {p.expected}"
            where = located.get((p.kind, p.path, p.module_path, p.op))
            self.findings.append(Finding(how, error, f"{p.kind}_mismatch", "what guard recorded", note.fix,
                                         where, "\n".join(lines), _trace_note(f"`{p.path}`")))

    def record(self, record: logging.LogRecord) -> None:
        """A log record: its exception (``log.exception``), or an error message logged as text."""
        if record.name.startswith("torchdoctor"):
            return
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            self.see("logged", exc)
        elif record.levelno >= logging.WARNING:  # explain's prefilter passes over a message in microseconds
            try:
                msg = record.getMessage()
            except Exception:  # a record whose arguments do not format: the program's own logging will say so
                return
            handled = handling(msg)  # `except RuntimeError as e: log.error(str(e))`: the exception itself
            if handled is not None:
                self.see("logged", handled)
            elif re.search(_WORDS, msg):  # a message with no word of a placement error never loads explain
                self.see("logged", None, msg, first_own_frame([(record.pathname, record.lineno, record.funcName)],
                                                              self.root))

    def uninstall(self) -> None:
        if self._saved:
            logging.Logger.handle, sys.excepthook, threading.excepthook = self._saved[:3]  # type: ignore[method-assign]
            for name, original in zip(_PRINTERS, self._saved[3:]):
                setattr(traceback, name, original)
            self._saved = []
            unwrap(self._streams)


# words one of them holds: every placement error names an error, a device, a dtype or a tensor type (compiled when read)
_WORDS = r"(?i)error|device|dtype|cuda|cpu|mps|xpu|half|float|double|scalar ?type|tensor|kernel|driver"

# the traceback module's printers and formatters (print_exc / format_exc call these by their module names)
_PRINTERS = ("print_exception", "format_exception")


def _trace_note(culprit: str | None) -> str | None:
    """What an active trace recorded for the first tensor path guard named (``unet.conv_in.weight``)."""
    if not culprit:
        return None
    from torchdoctor._trace.api import active, note_for

    if not active():
        return None
    # a path in backticks, or guard's ``culprit lm_head.weight: i8[128,64]@cuda:0`` line
    for path in re.findall(r"(?m)`([A-Za-z_][\w.]*\.[\w.]+)`|^\s*culprit ([A-Za-z_][\w.]*\.[\w.]+):", culprit):
        path = path[0] or path[1]
        note = note_for(path)
        if note:
            return f"{path}: {note}"
    return None
