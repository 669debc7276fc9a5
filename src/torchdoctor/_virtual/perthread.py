"""The current device index of each virtual device type, per thread, as the CUDA runtime keeps it: a thread the
program starts begins on index 0 whatever the thread that started it chose with ``torch.cuda.set_device(1)`` (a web
server's worker thread that makes ``torch.zeros(n, device="cuda")`` gets cuda:0, not the model's cuda:1). What the
run itself selects for the whole process (``run --device cuda:1``, as ``CUDA_VISIBLE_DEVICES`` would) is every
thread's start."""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["ThreadCurrent"]


class ThreadCurrent:
    """``get`` / ``[]`` of a dict of device type -> index, one per thread (module doc)."""

    def __init__(self) -> None:
        self.base: dict[str, int] = {}  # the process-wide selection: each thread's start
        self._local = threading.local()

    def _mine(self) -> dict[str, int]:
        mine: dict[str, int] | None = getattr(self._local, "d", None)
        if mine is None:
            mine = self._local.d = dict(self.base)
        return mine

    def get(self, kind: str, default: Any = None) -> Any:
        return self._mine().get(kind, default)

    def __getitem__(self, kind: str) -> int:
        return self._mine()[kind]

    def __setitem__(self, kind: str, index: int) -> None:
        self._mine()[kind] = index

    def select(self, kind: str, index: int) -> None:
        """For the whole process (every thread's start) and this thread."""
        self.base[kind] = index
        self._mine()[kind] = index
