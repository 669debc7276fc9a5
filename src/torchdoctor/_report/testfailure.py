"""How a placement failure shows in pytest's report (the plugin's ``pytest_runtest_makereport``): the
``PlacementError`` over the test's own frames, its fix written with the names the test holds. Loaded with the first
failing test, never at collection.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest


def named_as_in_test(exc: BaseException, item: pytest.Item) -> None:
    """The error's fix (``model.scale.data = ...``) written with the names the test's own frame holds (``m.scale``):
    pasted into the test, it runs. The message's text before its ``Fix:`` block is left as it is."""
    test = getattr(getattr(item, "obj", None), "__code__", None)
    tb, names = exc.__traceback__, None
    while tb is not None and names is None:
        if tb.tb_frame.f_code is test:
            names = {**tb.tb_frame.f_globals, **tb.tb_frame.f_locals}
        tb = tb.tb_next
    message = str(exc.args[0]) if exc.args else ""
    if not names or "Fix:" not in message:
        return
    from torchdoctor._run.names import held_code

    head, sep, fix = message.partition("Fix:")
    renamed = held_code(fix, names)
    if renamed != fix:
        exc.args = (head + sep + renamed, *exc.args[1:])
        if isinstance(getattr(exc, "fix", None), str):
            exc.fix = held_code(exc.fix, names)  # type: ignore[attr-defined]


def _at_test(exc: BaseException, item: pytest.Item, stacks: dict[Any, Any]) -> Any:
    """A failure recorded on the way (simulate), shown as pytest shows a traceback: the test's line that made the
    call, then the line of the user's code (a forward) where the first problem was met, ``E`` lines under it; the
    summary line reads ``FAILED ... - torchdoctor.PlacementError: <headline>`` like any exception's. Without a
    recorded stack in the user's code (a problem found on exit, such as memory), the test's ``def`` line."""
    from _pytest._code.code import ReprEntry, ReprExceptionInfo, ReprFileLocation, ReprTraceback

    text = f"torchdoctor.PlacementError: {exc}"
    error = [f"E   {line}" if line else "E" for line in text.splitlines()]
    places = _user_frames(exc, item, stacks) or [_def_line(item)]
    entries = []
    for i, (path, lineno, func, source) in enumerate(places):
        lines = [f"    {source}"] if source else []
        if i == len(places) - 1:
            lines += error
        entries.append(ReprEntry(lines=lines, reprfuncargs=None, reprlocals=None,
                                 reprfileloc=ReprFileLocation(path, lineno, f"in {func}"), style="short"))
    path, lineno = places[-1][0], places[-1][1]
    return ReprExceptionInfo(reprtraceback=ReprTraceback(reprentries=entries, extraline=None, style="short"),
                             reprcrash=ReprFileLocation(path, lineno, text.splitlines()[0]))


def _def_line(item: pytest.Item) -> tuple[str, int, str, str]:
    """(path, line, function, source) of the test's ``def`` line (not its first decorator's)."""
    path, lineno0, name = item.location
    lineno, source = (lineno0 or 0) + 1, ""
    try:
        import inspect

        lines, start = inspect.getsourcelines(getattr(item, "obj"))
        i = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith(("def ", "async def ")))
        lineno, source = start + i, lines[i].strip()
    except Exception:  # no source: the location alone
        pass
    return path, lineno, name.split("[")[0], source


def _user_frames(exc: BaseException, item: pytest.Item, stacks: dict[Any, Any]) -> list[tuple[str, int, str, str]]:
    """The frames of the test's and the user's code (outermost first) on the stack that recorded the first
    problem of ``exc`` that has one; torch's, torchdoctor's and pytest's frames left out, as pytest's short
    traceback leaves them."""
    import linecache

    from _pytest.pathlib import bestrelpath

    here = item.config.invocation_params.dir
    for problem in getattr(exc, "problems", ()) or ():
        stack = stacks.get((problem.kind, problem.path))
        if not stack:
            continue
        # from the test function's own frame on: what called it (pytest, runpy, a launcher script) is not the test's
        test = getattr(getattr(item, "obj", None), "__code__", None)
        start = 0 if test is None else next(
            (i for i, (filename, _, func) in enumerate(stack) if func == test.co_name
             and os.path.realpath(filename) == os.path.realpath(test.co_filename)), 0)
        out = []
        for filename, lineno, func in stack[start:]:
            if internal(filename) or filename.startswith("<"):
                continue
            try:
                shown = bestrelpath(here, Path(filename))
            except ValueError:  # another drive (Windows)
                shown = filename
            out.append((shown, lineno, func, linecache.getline(filename, lineno).strip()))
        if out:
            return out
    return []


def short(excinfo: pytest.ExceptionInfo[BaseException], item: pytest.Item, stacks: dict[Any, Any]) -> Any:
    """The PlacementError over the test's own frames: those of the error it explains (its ``__cause__``), where
    the test's line is, without torch's, the simulator's or pytest's frames and without the chained original."""
    exc = excinfo.value
    cause = exc.__cause__
    tb = cause.__traceback__ if cause is not None and cause.__traceback__ is not None else exc.__traceback__
    info = pytest.ExceptionInfo.from_exc_info((type(exc), exc, tb)) if tb is not None else excinfo
    frames = info.traceback.filter(lambda entry: not internal(str(entry.path)))
    if not len(frames):  # recorded on the way (simulate): the report is the whole story, at the test's line
        try:
            return _at_test(exc, item, stacks)
        except Exception:  # pytest's representation classes moved: the text alone
            text = f"torchdoctor.PlacementError: {exc}"
            return "\n".join(f"E   {line}" if line else "E" for line in text.splitlines())
    info.traceback = frames
    return info.getrepr(style="short", chain=False, funcargs=False, showlocals=False)


def internal(path: str) -> bool:
    p = path.replace("\\", "/")
    return ("/torchdoctor/" in p and "/tests/" not in p) or "/site-packages/" in p or "/torch/" in p \
        or "/_pytest/" in p or "/pluggy/" in p or p.endswith("/contextlib.py")
