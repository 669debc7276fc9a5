"""What a virtual-device run on this thread answers for the hardware it sees, read by device choice and ``env``.

The virtual runtime never imports this package (a virtual block's start stays cheap): its ``env_view`` is read from
its module when that module is loaded at all. ``VIRTUAL`` keeps views registered the older way.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

VIRTUAL: list[Callable[[], Mapping[str, Any] | None]] = []


def virtual_view() -> Mapping[str, Any] | None:
    """None outside a virtual run, else ``{"type", "facts": to lay over the machine's, "run": (family, dtype) ->
    error or None, "outside": a context for the machine's own probes}`` from the run's profile."""
    view = getattr(sys.modules.get("torchdoctor._virtual.hardware"), "env_view", None)
    return view() if view is not None else VIRTUAL[0]() if VIRTUAL else None
