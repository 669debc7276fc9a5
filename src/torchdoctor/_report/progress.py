"""Progress on stderr for work that takes more than about a second; silent otherwise.

>>> with progress("reading", total=3) as p:
...     for _ in range(3):
...         p.advance()

Nothing is drawn unless the stream is a terminal (or ``TORCHDOCTOR_PROGRESS=1`` asks for it, e.g. in a CI log),
``quiet`` is off and the work has run for ``delay`` seconds (a background thread draws a spinner then, so a single
long call such as one forward is covered too; with a ``total`` it shows ``done/total`` and a bar). A line wider
than the terminal shortens its label, never the count, the bar or the time. The line is erased when the work ends,
so what the command prints afterwards starts on a clean line.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

_FRAMES = "|/-\\"


class Progress:
    """What ``progress(...)`` yields: ``advance(n=1)`` and ``note(text)`` are cheap and thread-safe."""

    def __init__(self, label: str, total: int | None, stream: TextIO | None, delay: float, interval: float) -> None:
        self.label, self.total, self.done, self.detail = label, total, 0, ""
        self._stream, self._delay, self._interval = stream, delay, interval
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._drawn = 0  # width of what is on the line now
        self._tick = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        if stream is not None:
            self._thread = threading.Thread(target=self._run, name="torchdoctor-progress", daemon=True)
            self._thread.start()

    @property
    def drawing(self) -> bool:
        """Whether this progress draws at all (a terminal, or asked for): counting work is worth it only then."""
        return self._stream is not None

    def advance(self, n: int = 1) -> None:
        self.done += n

    def note(self, detail: str) -> None:
        """What is being worked on now (a file name, a target), shown after the count."""
        self.detail = detail

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def line(self, width: int | None = None) -> str:
        """The line; within ``width`` the label is shortened first, so the count, the bar and the time stay."""
        # a count past its total (work repeated, as simulate's proof re-runs are) stays at the total
        done = min(self.done, self.total) if self.total else self.done
        count = f" {done}/{self.total}" if self.total else (f" {done}" if done else "")
        detail = f" {self.detail}" if self.detail else ""
        bar = f" [{'#' * (10 * done // self.total):.<10}]" if self.total else ""
        head, tail = f"{_FRAMES[self._tick % len(_FRAMES)]} ", f"{count}{detail}{bar} ({self.elapsed:.0f} s)"
        label = self.label
        if width is not None and len(head) + len(label) + len(tail) > width:
            room = width - len(head) - len(tail) - 1
            label = label[: room - 2] + "..." if room > 8 else label
        return (head + label + tail)[:width] if width is not None else head + label + tail

    def _run(self) -> None:
        if self._stop.wait(self._delay):
            return
        while not self._stop.is_set():
            self._draw()
            self._stop.wait(self._interval)

    def _draw(self) -> None:
        stream = self._stream
        if stream is None:
            return
        with self._lock:
            self._tick += 1
            try:
                import shutil

                text = self.line(max(10, shutil.get_terminal_size().columns - 1))
                stream.write("\r" + text + " " * max(0, self._drawn - len(text)))
                stream.flush()
                self._drawn = len(text)
            except (OSError, ValueError):  # a closed or broken terminal: stop drawing, never fail the work
                self._stream = None

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        with self._lock:
            if self._stream is not None and self._drawn:
                try:
                    self._stream.write("\r" + " " * self._drawn + "\r")
                    self._stream.flush()
                except (OSError, ValueError):
                    pass
            self._drawn = 0


def _is_tty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def wanted(quiet: bool = False, stream: TextIO | None = None) -> bool:
    """Whether a progress line would be drawn on ``stream`` (default stderr): never when ``quiet``; on a terminal,
    or anywhere when ``TORCHDOCTOR_PROGRESS=1`` asks for it."""
    if quiet:
        return False
    return os.environ.get("TORCHDOCTOR_PROGRESS", "") == "1" or _is_tty(sys.stderr if stream is None else stream)


@contextlib.contextmanager
def progress(label: str, total: int | None = None, *, quiet: bool = False, stream: TextIO | None = None,
             delay: float = 1.0, interval: float = 0.1) -> Iterator[Progress]:
    """A progress line on ``stream`` (default stderr) for work over ``delay`` seconds; silent when ``quiet``
    or when the stream is not a terminal (unless ``TORCHDOCTOR_PROGRESS=1``)."""
    out = sys.stderr if stream is None else stream
    p = Progress(label, total, out if wanted(quiet, out) else None, delay, interval)
    try:
        yield p
    finally:
        p.close()
