"""An error the program catches and reports by its message only: ``except RuntimeError as e: log.error(str(e))``,
``print(f"failed: {e}")``.

While an ``except`` block runs, ``sys.exc_info()`` is the exception it handles, in every function it calls: the
logging call and the ``print`` inside it see it too. So a message that holds the first line of the exception being
handled is that exception, with its traceback, its line and guard's culprit, not only its text. ``Echo`` stands in
for ``sys.stdout`` / ``sys.stderr`` while the program runs: each write is passed on unchanged; only a write made
while an exception is handled is compared with it (a string search), so printing costs nothing more otherwise.
"""

from __future__ import annotations

import sys
import threading
from typing import Any


def handling(text: str) -> BaseException | None:
    """The exception being handled where ``text`` is logged or printed, when ``text`` holds its message."""
    exc = sys.exc_info()[1]
    if exc is None or isinstance(exc, (SystemExit, KeyboardInterrupt, StopIteration, GeneratorExit)):
        return None
    try:
        first = (str(exc).strip().splitlines() or [""])[0].strip()
    except Exception:  # noqa: BLE001 - an exception whose str() fails
        return None
    return exc if len(first) >= 8 and first in text else None


class Echo:
    """A program's ``sys.stdout`` or ``sys.stderr``: every attribute is the stream's own; ``write`` first shows
    ``seen`` an exception being handled whose message the text holds."""

    def __init__(self, stream: Any, seen: Any) -> None:
        object.__setattr__(self, "_td_stream", stream)
        object.__setattr__(self, "_td_seen", seen)
        object.__setattr__(self, "_td_busy", threading.local())

    def write(self, text: Any) -> Any:
        busy = self._td_busy
        if isinstance(text, str) and sys.exc_info()[1] is not None and not getattr(busy, "on", False):
            busy.on = True  # what the explanation itself prints is not looked at again
            try:
                exc = handling(text)
                if exc is not None:
                    self._td_seen(exc)
            except Exception:  # noqa: BLE001 - a diagnostic never breaks the program's output
                pass
            finally:
                busy.on = False
        return self._td_stream.write(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._td_stream, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._td_stream, name, value)

    def __iter__(self) -> Any:
        return iter(self._td_stream)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._td_stream.__exit__(*exc)


def wrap(seen: Any) -> tuple[Any, Any]:
    """Put ``Echo`` in place of ``sys.stdout`` and ``sys.stderr``; the streams it replaced."""
    saved = (sys.stdout, sys.stderr)
    if sys.stdout is not None:
        sys.stdout = Echo(sys.stdout, seen)  # type: ignore[assignment]
    if sys.stderr is not None:
        sys.stderr = Echo(sys.stderr, seen)  # type: ignore[assignment]
    return saved


def unwrap(saved: tuple[Any, Any]) -> None:
    """Put the streams back, where the program left ours in place (a stream it set itself stays)."""
    if isinstance(sys.stdout, Echo):
        sys.stdout = saved[0]
    if isinstance(sys.stderr, Echo):
        sys.stderr = saved[1]
