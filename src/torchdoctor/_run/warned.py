"""Warnings that say the program silently runs otherwise than it asked: ``torch.autocast("cuda")`` hard-coded in a
trainer, on a machine without CUDA (an Intel GPU, a Mac, a CPU), warns "CUDA is not available or torch_xla is
imported. Disabling autocast." once and the whole step runs in float32: twice the memory, none of the low-precision
speed, no error. ``run`` watches ``warnings.showwarning`` (what displays a warning, after the program's own filters)
and makes that one a finding at the program's line, with the autocast written for the machine's own device type
(``dev.type`` when the program holds the device by a name). The fix is checked by entering that autocast on this
machine (it stays enabled); the program's line is not re-run.
"""

from __future__ import annotations

import contextlib
import linecache
import re
import sys
import warnings
from collections.abc import Iterator
from typing import Any

_CUDA_OFF = "CUDA is not available or torch_xla is imported. Disabling autocast."
_LITERAL = r"""(?:device_type\s*=\s*)?(["'])cuda\1"""  # compiled (by ``re``) when a warning is read


@contextlib.contextmanager
def watched_warnings(watcher: Any) -> Iterator[None]:
    """While the program runs, each warning it displays is also shown to ``_seen`` (never changes what it prints)."""
    original = warnings.showwarning

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        try:
            if str(message).startswith(_CUDA_OFF):
                _seen(watcher, str(message), category, filename, lineno)
        except Exception:  # a diagnostic must not break the program it watches
            pass
        original(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        if warnings.showwarning is show:
            warnings.showwarning = original


def _frame_at(filename: str, lineno: int) -> Any:
    f: Any = sys._getframe(2)
    while f is not None and not (f.f_code.co_filename == filename and f.f_lineno == lineno):
        f = f.f_back
    return f


def _seen(watcher: Any, message: str, category: Any, filename: str, lineno: int) -> None:
    import torch

    from torchdoctor._run.watch import Finding, first_own_frame

    frame = _frame_at(filename, lineno)
    where = first_own_frame([(filename, lineno, frame.f_code.co_name if frame is not None else "?")], watcher.root)
    error = f"{getattr(category, '__name__', 'UserWarning')}: {message}"
    if any(f.error == error and f.where == where for f in watcher.findings):
        return
    acc = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
    kind = acc.type if acc is not None else "cpu"
    source = linecache.getline(filename, lineno).rstrip("\r\n")
    fix, diff = _fix(source, kind, frame, filename, lineno)
    finding = Finding("warned", error, "autocast_disabled",
                      f"autocast asked for cuda on a machine whose device is {kind}: it is disabled, and what it "
                      "wraps runs in float32 (no error)", fix, where)
    finding.fix_from, finding.diff = "run", diff
    with watcher._lock:
        watcher.findings.append(finding)


def _fix(source: str, kind: str, frame: Any, filename: str, lineno: int) -> tuple[str, str | None]:
    """The line with the machine's own device type in its autocast, checked by entering it here; its diff."""
    import torch

    from torchdoctor._report.diff import line_patch

    name = _device_name(frame, kind)
    expr = f"{name}.type" if name else ("torch.accelerator.current_accelerator().type" if kind != "cpu" else '"cpu"')
    m = re.search(_LITERAL, source) if "autocast" in source else None
    found = re.search(r"dtype\s*=\s*torch\.(\w+)", source)
    dtype = getattr(torch, found.group(1), None) if found else None
    if not isinstance(dtype, torch.dtype):
        dtype = torch.get_autocast_dtype(kind)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with torch.autocast(kind, dtype=dtype):
            enabled = torch.is_autocast_enabled(kind)
    works = enabled and not any("Disabling" in str(w.message) for w in said)
    check = (f"# ^ checked: torch.autocast({kind!r}, dtype={dtype}) stays enabled on this machine; the line was not "
             "re-run" if works else f"# ^ unproven: torch.autocast({kind!r}, dtype={dtype}) is not enabled here either")
    if m is None:
        return (f"# autocast with the machine's own device type, e.g. torch.autocast({expr}, dtype={dtype})\n"
                f"{check}"), None
    line = source[:m.start()] + ("device_type=" if m.group(0).startswith("device_type") else "") + expr \
        + source[m.end():]
    return f"{line.strip()}  # the machine's own device type, not a hard-coded 'cuda'\n{check}", \
        line_patch(filename, lineno, line) if works else None


def _device_name(frame: Any, kind: str) -> str | None:
    """A name the program's frame holds a ``torch.device`` of this machine's type by (``dev``)."""
    import torch

    if frame is None:
        return None
    for scope in (frame.f_locals, frame.f_globals):
        for key, value in scope.items():
            if isinstance(value, torch.device) and value.type == kind and not key.startswith("_"):
                return str(key)
    return None
