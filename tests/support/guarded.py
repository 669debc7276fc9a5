"""A generous hang guard for tests: run ``fn`` in a daemon thread, fail if it does not return in time, hand back
its value or its exception (speed targets live in ``bench/``, not in tests)."""

from __future__ import annotations

import threading
from typing import Any


def guarded(fn: Any, timeout: float = 120.0, what: str = "hung") -> Any:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed back to the caller below
            box["error"] = exc

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(timeout)
    assert not th.is_alive(), what
    if "error" in box:
        raise box["error"]
    return box.get("value")
