"""The threads a program started, at its end, as Python's own exit treats them.

Before Python joins the non-daemon threads at exit it runs the hooks registered with ``threading``: the one of
``concurrent.futures`` wakes every idle pool worker, which finishes the work already queued and ends. ``run`` prints
its summary after the program's threads are done, so it joins them itself, and a pool the program still holds (in a
global of the script or of a module it imported) would otherwise keep its idle workers waiting forever. Each worker
of such a pool has its executor shut down without waiting (the queued work still runs, as at exit) before the join.
Only threads the program started are joined: in a process that was running threads before (a caller of ``run()``),
those are not the program's to wait for, and no process-wide exit hook is run.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any


def threads_now() -> set[threading.Thread]:
    """The threads alive now (those the program did not start)."""
    return set(threading.enumerate())


def _pool_of(thread: threading.Thread) -> Any:
    """The ``ThreadPoolExecutor`` whose worker ``thread`` is (its worker holds a weak reference to it), or None."""
    import sys

    futures = sys.modules.get("concurrent.futures.thread")
    if futures is None or thread not in getattr(futures, "_threads_queues", {}):
        return None
    for arg in getattr(thread, "_args", ()):
        if isinstance(arg, weakref.ref):
            pool = arg()
            if isinstance(pool, futures.ThreadPoolExecutor):
                return pool
    return False  # a worker whose executor this Python does not show: Python's own exit wakes it


def join_program_threads(before: set[threading.Thread], timeout: float = 3600.0) -> None:
    """Wait for the non-daemon threads the program started (not those in ``before``), as Python waits at exit."""
    current = threading.current_thread()
    started = [t for t in threading.enumerate()
               if t is not current and t not in before and not t.daemon and t.is_alive()]
    waiting = []
    for t in started:
        pool = _pool_of(t)
        if pool is False:
            continue
        if pool is not None:
            pool.shutdown(wait=False)
        waiting.append(t)
    for t in waiting:
        t.join(timeout)
