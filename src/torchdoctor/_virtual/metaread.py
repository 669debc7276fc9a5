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


def hook_copy_fixes(items: list[Any], cases: Any, device: Any) -> list[Any]:
    """``items`` with the meta note ("load the weights onto the device") replaced by the hook's-copy fix of each
    failing op's line that ``offloaded_here`` found reading an offloaded weight outside its module's call (loading
    the weights would undo the offload); the note stays when a meta operand was met at another line."""
    from torchdoctor._virtual.feeder import operands
    from torchdoctor._virtual.prove import Fix

    notes = [f for f in items if f.kind == "note" and f.code.startswith("# ") and " on meta (no data" in f.code]
    if not notes or not FOUND or not cases:
        return items
    fixes: dict[str, Any] = {}
    other = False
    for c in cases:
        ops = operands(c.before)
        meta = [o for o in ops if o.device.type == "meta"]
        if not meta:
            continue
        hit = FOUND.get(f"offloaded at {c.at}")
        if hit is None or hit[2] is None:
            other = True
            continue
        if c.at in fixes:
            continue
        target = next((o.device for o in ops if o.device.type not in ("meta", "cpu")), device)
        code = "\n".join(x for x in hit[1].splitlines() if not x.startswith("# ^ unproven"))  # the proof says
        fixes[c.at] = Fix(code, "note", target, diff=hit[2], sets=tuple((o.tags[0], target) for o in meta if o.tags))
    if not fixes:
        return items
    out = [f for f in items if other or not any(f is n for n in notes)]
    return out + list(fixes.values())
