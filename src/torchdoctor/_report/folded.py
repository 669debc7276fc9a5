"""A plan of many steps as a reader needs it: what ``Module.to`` would miss first, one line each (the reason to
use ``move``), then the steps ``Module.to`` would take too, folded by module.

A pipeline's plan is hundreds of parameter rows (``vae.encoder.down_blocks.0.resnets.0.conv1.weight`` ...); the
few tensors hanging off weights, in lists or in plain attributes were lost after them behind "... and 337 more".
A plan that fits in ``limit`` rows is listed whole; a longer one is folded by the module path down to
``depth`` names, with numbered blocks (``layers.0`` ... ``layers.79``)
folded into one range, and says each fold's change (``f32@cpu -> bf16@cuda:0``) when all its steps share it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any

_NUMBERED = re.compile(r"\.(\d+)(?=\.|$)")
_FORM = re.compile(r"^([a-z0-9_]+)\[[^\]]*\]@(.+)$")  # "f32[4,4]@cpu" -> ("f32", "cpu")


def _kind(form: str) -> str:
    """A compact form without its shape: ``f32[2,2]@cpu`` -> ``f32@cpu``."""
    m = _FORM.match(form)
    return f"{m.group(1)}@{m.group(2)}" if m else form


def _fold_key(path: str, depth: int) -> str:
    """The module a parameter path is folded under: its first ``depth`` names, numbered blocks as ``N``."""
    parts = path.split(".")[:-1][:depth] or ["<root>"]
    return ".".join("N" if p.isdigit() else p for p in parts)


PLAN_HEADS = ("that Module.to would miss (move handles them)", "that Module.to would move too")
MOVE_HEADS = ("that Module.to would have missed", "that Module.to would have moved too")


def fold_plan(steps: Sequence[Any], limit: int = 40, depth: int = 2, heads: tuple[str, str] = PLAN_HEADS
              ) -> list[str]:
    """The lines of a plan (after its headline): ``steps`` are ``PlanStep``-like (``path``, ``found``,
    ``expected``, ``missed_by_module_to``, ``str()``); ``heads`` name the two groups."""
    missed = [s for s in steps if getattr(s, "missed_by_module_to", False)]
    rest = [s for s in steps if not getattr(s, "missed_by_module_to", False)]
    lines: list[str] = []
    if missed:
        lines.append(f"{sum(getattr(s, 'count', 1) for s in missed)} {heads[0]}:")  # a folded row counts its rows
        lines += [f"  {s}" for s in missed[:limit]]
        if len(missed) > limit:
            lines.append(f"  ... and {len(missed) - limit} more (use --json for all)")
    if rest and len(rest) + min(len(missed), limit) <= limit:  # few enough to read one by one: nothing folded
        lines.append(f"{len(rest)} {heads[1]}:")
        lines += [f"  {s}" for s in rest]
    elif rest:
        folds: dict[str, list[Any]] = {}
        for s in rest:
            folds.setdefault(_fold_key(s.path, depth), []).append(s)
        lines.append(f"{len(rest)} {heads[1]}, by module:")
        for key, members in list(folds.items())[:limit]:
            changes = {(_kind(s.found), _kind(s.expected)) for s in members}
            change = "{} -> {}".format(*next(iter(changes))) if len(changes) == 1 else f"{len(changes)} kinds of change"
            lines.append(f"  {_shown(key, members)}  {len(members)} tensor(s)  {change}")
        if len(folds) > limit:
            lines.append(f"  ... and {len(folds) - limit} more modules (use --json for all)")
    return lines


def _shown(key: str, members: Sequence[Any]) -> str:
    """``layers.N`` shown with the range of block numbers its members have (``layers.0-79``)."""
    if "N" not in key.split("."):
        return key
    at = key.split(".").index("N")
    numbers = sorted({int(p.split(".")[at]) for p in (m.path for m in members)
                      if len(p.split(".")) > at and p.split(".")[at].isdigit()})
    if not numbers:
        return key
    span = str(numbers[0]) if len(numbers) == 1 else f"{numbers[0]}-{numbers[-1]}"
    parts = key.split(".")
    parts[at] = span
    return ".".join(parts)


class _Done:
    """One row of a finished move (``Moved``: path, src, dst) as ``fold_plan`` reads a plan step; or, with
    ``count``, the state of one optimizer folded into one row."""

    __slots__ = ("path", "found", "expected", "missed_by_module_to", "count")

    def __init__(self, path: str, found: str, expected: str, missed: bool, count: int = 1) -> None:
        self.path, self.found, self.expected, self.missed_by_module_to, self.count = path, found, expected, missed, count

    def __str__(self) -> str:
        change = f"{self.found} -> {self.expected}" if self.expected else self.found
        return f"{self.path}  {self.count} tensor(s)  {change}" if self.count > 1 else f"{self.path}  {change}"


def fold_moves(moved: Sequence[Any], missed: Collection[str], limit: int = 40, optimizers: Sequence[str] = ()
               ) -> list[str]:
    """What a move did, as a plan is shown: the rows ``Module.to`` would have missed (paths in ``missed``) first,
    one line each, an optimizer's state (``<path>.state[...]`` of each path in ``optimizers``) as one line, then
    the rest folded by module."""
    gone = set(missed)
    rows: list[_Done] = []
    state: dict[str, tuple[_Done, list[Any]]] = {}  # optimizer path -> its one row (where its first state row was)
    for m in moved:
        owner = next((o for o in optimizers if m.path.startswith(o + ".state[")), None)
        if owner is None or m.path not in gone:
            rows.append(_Done(m.path, m.src, m.dst, m.path in gone))
            continue
        if owner not in state:
            state[owner] = (_Done(owner + ".state", "", "", True), [])
            rows.append(state[owner][0])
        state[owner][1].append(m)
    for row, members in state.values():
        changes = {(_kind(m.src), _kind(m.dst)) for m in members}
        row.found, row.expected = next(iter(changes)) if len(changes) == 1 else (f"{len(changes)} kinds of change", "")
        row.count = len(members)
    return fold_plan(rows, limit, heads=MOVE_HEADS)
