"""A meta tensor an op meets at a line of the program that reads an accelerate-offloaded weight outside its module's
call (``self.block(x) * self.block.scale`` under ``cpu_offload``): the weight is a meta placeholder there and its
values are in the hook's map. Found while the program's frame is alive (``torchdoctor run``'s ``offloaded_at`` reads
the line's names); the culprit is said with the problem and the fix (the hook's own copy at that line) is kept by the
line for the fix writer, never ``load_state_dict``, which would undo the offload.
"""

from __future__ import annotations

from typing import Any

FOUND: dict[str, tuple[str, str, str | None]] = {}  # "offloaded at file:line" -> (culprit, fix, diff); this run's
_LIMIT = 256


def offloaded_here() -> tuple[str, tuple[str, str, str | None]] | None:
    """(``offloaded at file:line``, (culprit, fix, diff)) for the program's line running now, or None."""
    from torchdoctor._virtual.origin import short_at, user_frame

    f = user_frame(3)
    if f is None:
        return None
    try:
        from torchdoctor._run.offloaded import offloaded_at

        hit: Any = offloaded_at(f)
    except Exception:  # reading the program's names is a courtesy: never a break of the run
        return None
    if hit is None:
        return None
    key = f"offloaded at {short_at(f)}"
    if len(FOUND) < _LIMIT:
        FOUND[key] = hit
    return key, hit
