"""Repeated paragraphs of a log read once: what the scanner did with a paragraph is replayed where it comes again.

A log made of error texts repeats whole paragraphs (one failure every step, the same few errors over and over,
each text followed by a blank line). The scanner's work per marked line is Python (its line, its window's bounds
and memo key, the group update); a paragraph met again is found at C speed (a slice and a dict look-up) and its
effect applied at once: the hit count, each group's count and last sequence number, each signature's window end,
and the previous error's key and end (which bound the next new error's leading context).

A paragraph runs from the line after a blank line up to and with the next blank line(s). Its effect is recorded
when it is read the ordinary way and is replayed only where that gives exactly what reading it again would:
- what the reading looked at lies in the paragraph, the blank line before it (the same ``"\\n\\n"`` everywhere),
  and a recorded tail after it that must follow it again (a message whose ``follow`` lines or continuation check
  reached into the next paragraph); a line the scanner read the other way (cut, too long) makes it not replayable;
- no window examined before it reaches into it (an earlier error's window would hide its hits), before recording
  and before replaying;
- every group it counts exists already (it made them when recorded), so no context is taken again;
- the frames-only switch (``spoken``) is part of the key, and the hit limit holds.
Where replays are rare (every paragraph different: time stamps) the rest of a block is read the ordinary way, so
a log without repeats pays for a few dozen look-ups a block.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["FAR", "FRESH", "scan_chunked"]

FAR = 1 << 62  # "read up to somewhere unknown": never replayable
FRESH: Any = object()  # the scanner's previous error key while a paragraph is recorded: none met in it yet
_TRY = 256  # paragraphs of a text read, not replayed, before the replays must be half as many
_MAX_CHUNK = 1 << 14  # longer paragraphs are read the ordinary way (their text is not kept)
_KEPT = 1 << 23  # characters of paragraph text remembered per text read (then the memo starts again)
_NONE: Any = object()
_BLANKS = re.compile("\n\n+")


def scan_chunked(sc: Any, text: str, start: int, cut: int, max_hits: int) -> None:
    """The marked lines of ``text[start:cut]`` as ``sc._lines_hits`` reads them, paragraph by paragraph,
    replaying a paragraph's recorded effect where it is exact to. Written for speed: a log of short error texts
    has a paragraph every few hundred characters, and the replay is all the Python most of them cost (the
    scanner's counters are kept in locals while paragraphs are replayed, and written back before any reading);
    paragraphs read the ordinary way one after another are read in one go (a log's long ones: as without this).
    A replay only counts itself in its effect's cell (times, sequence number and place of its last replay); the
    groups' counts and last sequence numbers and the windows' ends are written once, before anything reads them
    (``_flush``): a replay costs a slice, a look-up and a few stores."""
    chunks, until = sc.chunks, sc.until
    umax = max(until.values(), default=-1)  # no window examined so far reaches past this
    pos = start
    pending = -1  # where paragraphs waiting to be read the ordinary way begin
    hits, seq, prev_key, prev_end, floor, spoken = sc.hits, sc.seq, sc.prev_key, sc.prev_end, sc.floor, sc.spoken
    get = chunks[spoken].get
    replayed = 0
    used: list[Any] = []  # the effects replayed since the last flush
    for m in _BLANKS.finditer(text, start, cut):  # several blank lines: the paragraph ends after the last
        ce = m.end()
        if ce >= cut:
            break
        cs = pos
        pos = ce
        if cs == start or ce - cs > _MAX_CHUNK:  # the block's first piece (the line before it is not a blank one)
            if pending == -1:
                pending = cs
            continue
        eff = get(text[cs:ce], _NONE)
        if eff is None:  # not replayable: read with its neighbours
            if pending == -1:
                pending = cs
            continue
        # read what waits first: the scanner's state as replayed so far, then as that reading leaves it
        if pending != -1:
            if used:
                _flush(used, until)
            sc.hits, sc.seq, sc.prev_key, sc.prev_end, sc.floor = hits, seq, prev_key, prev_end, floor
            sc._lines_hits(text, pending, cs)
            pending = -1
            umax = max(until.values(), default=-1)
            hits, seq, prev_key, prev_end, floor = sc.hits, sc.seq, sc.prev_key, sc.prev_end, sc.floor
            if sc.spoken is not spoken:
                spoken = sc.spoken
                get = chunks[spoken].get
                eff = get(text[cs:ce], _NONE)
        if eff is not _NONE and eff is not None:
            n, more, first, moved, last, last_end, follow, firsts, reach, cell, _, _ = eff
            if hits + n <= max_hits and (not follow or text.startswith(follow, ce)) and (
                    umax <= cs or _flush(used, until) or all(until.get(name, -1) <= cs + rel for name, rel in firsts)):
                hits += n
                if not cell[0]:
                    used.append(eff)
                cell[0] += 1
                cell[1] = seq
                cell[2] = cs
                seq += more
                if cs + reach > umax:
                    umax = cs + reach
                if first is not _NONE:
                    if first is not prev_key and first != prev_key:  # its first error against the one before
                        floor = prev_end
                    if moved is not None:
                        floor = cs + moved
                    prev_key, prev_end = last, cs + last_end
                replayed += 1
                continue
        sc.tried += 1  # looked up and not replayed
        sc.replayed += replayed
        replayed = 0
        if sc.tried > _TRY and sc.replayed * 2 < sc.tried:  # paragraphs do not repeat here: the rest at once
            pos = cs
            break
        if eff is not _NONE:  # recorded, not replayable here (what follows it, or an earlier window, differs)
            pending = cs
            continue
        if used:
            _flush(used, until)
        sc.hits, sc.seq, sc.prev_key, sc.prev_end, sc.floor = hits, seq, prev_key, prev_end, floor
        if sc.kept + ce - cs > _KEPT:
            for memo in chunks:
                memo.clear()
            sc.kept = 0
        chunks[spoken][text[cs:ce]] = _record(sc, text, cs, ce, max_hits)
        sc.kept += ce - cs
        umax = max(until.values(), default=-1)
        hits, seq, prev_key, prev_end, floor = sc.hits, sc.seq, sc.prev_key, sc.prev_end, sc.floor
        if sc.spoken is not spoken:
            spoken = sc.spoken
            get = chunks[spoken].get
    if used:
        _flush(used, until)
    sc.hits, sc.seq, sc.prev_key, sc.prev_end, sc.floor = hits, seq, prev_key, prev_end, floor
    sc.replayed += replayed
    sc._lines_hits(text, pending if pending != -1 else pos, cut)


def _flush(used: list[Any], until: dict[str, int]) -> bool:
    """Write what the replays since the last flush did: each group's count and last sequence number, each
    window's end, the later replays last (a group's last number and a window's end are its latest replay's).
    Empties ``used``; returns False."""
    if len(used) > 1:
        used.sort(key=_at)
    for eff in used:
        cell = eff[9]
        times, base, at = cell
        for g, n, rel in eff[10]:
            g.count += n * times
            g.last = base + rel
        for name, rel in eff[11]:
            until[name] = at + rel
        cell[0] = 0
    used.clear()
    return False


def _at(eff: Any) -> int:
    return eff[9][2]  # type: ignore[no-any-return]


def _record(sc: Any, text: str, cs: int, ce: int, max_hits: int) -> tuple[Any, ...] | None:
    """Read ``text[cs:ce]`` the ordinary way, noting its effect; None when it cannot be replayed."""
    hits0, seq0, pk0 = sc.hits, sc.seq, sc.prev_key
    sc.prev_key, sc.entry_key, sc.touched, sc.attempts, sc.moved = FRESH, pk0, [], [], False
    try:
        reach = sc._lines_hits(text, cs, ce)
    finally:
        touched, attempts, sc.touched, sc.attempts, sc.entry_key = sc.touched, sc.attempts, None, None, FRESH
        if sc.prev_key is FRESH:  # no error that moves the context's bounds was met
            sc.prev_key = pk0
            first = _NONE
        else:
            first = sc.first_key
    if reach >= FAR or sc.hits > max_hits:
        return None
    # per signature, its first hit looked at and where its window ended before the paragraph (only its own hits
    # move that end, and only those looked at: so the signatures whose ends moved are among these)
    firsts: dict[str, tuple[int, int]] = {}
    for name, p, before in attempts:
        if name not in firsts:
            firsts[name] = (p, before)
    if any(before > p for p, before in firsts.values()):
        return None  # a window examined before it hid some of its hits: what it did depends on what came before
    counted: dict[int, list[Any]] = {}
    for g in touched:
        c = counted.get(id(g))
        if c is None:
            counted[id(g)] = [g, 1]
        else:
            c[1] += 1
    groups = tuple((g, n, g.last - seq0) for g, n in counted.values())
    until = sc.until
    ends = tuple((name, until[name] - cs) for name, (_, before) in firsts.items() if until.get(name, -1) != before)
    floor = sc.floor - cs if first is not _NONE and sc.moved else None
    last, last_end = (sc.prev_key, sc.prev_end - cs) if first is not _NONE else (None, 0)
    # (hits, sequence numbers, first error key, floor, last error's key and end, what must follow the paragraph,
    #  (signature, first hit), the end of the windows, a cell for ``_flush``, (group, count, last), (signature,
    #  window end)): what a replay reads first, unpacked at once. The cell: (times replayed since the last flush,
    #  the sequence number and place of the last such replay)
    return (sc.hits - hits0, sc.seq - seq0, first, floor, last, last_end, text[ce:reach] if reach > ce else "",
            tuple((name, p - cs) for name, (p, _) in firsts.items()), max((rel for _, rel in ends), default=-1),
            [0, 0, 0], groups, ends)
