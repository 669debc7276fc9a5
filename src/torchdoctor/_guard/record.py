"""What guard keeps of a problem beyond its ``Problem`` fields (``Note``) and ``guard.report()`` (``GuardReport``).

Plain data, with no import of the machinery that fills it (``_guard/notes.py`` tells a problem: culprit, maker, fix,
proof): a guard that meets no problem never loads that machinery.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchdoctor._report.records import FrozenRecord


# frozen records written once, not compiled per class by the decorator: guard's api imports this module when `run`
# builds its guard before the program's first line (issue 43 point 4); tests/guard compare each with a twin the
# decorator makes
@dataclass(init=False, repr=False, eq=False)
class Note(FrozenRecord):
    """What guard said of a problem beyond its ``Problem`` fields: where the operand was made (one line per maker),
    the fix as code, its proof ("fix proven: ..." / "fix unproven: ..." with what was tried) and its diff."""

    maker: str | None = None
    fix: str | None = None
    proof: str | None = None
    patch: str | None = None
    groups: tuple[str, ...] = ()  # the components the fix casts whole (fix / warn tell their later ops once)
    aligns: tuple[str, str] = ("", "")  # a component's dtype and its neighbours': fix / warn align its ops to these
    _fields = ("maker", "fix", "proof", "patch", "groups", "aligns")

    def __init__(self, maker: str | None = None, fix: str | None = None, proof: str | None = None,
                 patch: str | None = None, groups: tuple[str, ...] = (), aligns: tuple[str, str] = ("", "")) -> None:
        d = self.__dict__
        d["maker"] = maker
        d["fix"] = fix
        d["proof"] = proof
        d["patch"] = patch
        d["groups"] = groups
        d["aligns"] = aligns

    @property
    def proven(self) -> bool:
        return bool(self.proof and self.proof.startswith("fix proven"))

    def to_dict(self) -> dict[str, Any]:
        return {"maker": self.maker, "fix": self.fix, "proven": self.proven, "proof": self.proof,
                "patch": self.patch}


NOTHING = Note()


def key_of(p: Any) -> tuple[Any, ...]:
    """The identity guard records a problem (a ``Problem``) under (kind, path, module, op)."""
    return (p.kind, p.path, p.module_path, p.op)


def said(note: Note) -> str:
    """What a warning adds of its note: the maker, the fix and whether it was proven (one line)."""
    out = ""
    if note.maker:
        out += "; " + note.maker.replace("\n", "; ")
    if note.fix:
        out += f"; fix ({'proven' if note.proven else 'unproven'}): " + note.fix.replace("\n", "; ")
    return out


@dataclass(init=False, repr=False, eq=False)
class GuardReport(FrozenRecord):
    """``guard.report()``: what one guard saw, as fields (``problems``, ``fixes``, the ``Note`` of each problem by
    ``key_of``) and as JSON-ready data (``to_dict``)."""

    mode: str
    problems: tuple[Any, ...]
    fixes: tuple[Any, ...]
    notes: Mapping[tuple[Any, ...], Note]
    _fields = ("mode", "problems", "fixes", "notes")

    def __init__(self, mode: str, problems: tuple[Any, ...], fixes: tuple[Any, ...],
                 notes: Mapping[tuple[Any, ...], Note]) -> None:
        d = self.__dict__
        d["mode"] = mode
        d["problems"] = problems
        d["fixes"] = fixes
        d["notes"] = notes

    def note(self, p: Any) -> Note:
        return self.notes.get(key_of(p), NOTHING)

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "ok": not self.problems,
                "problems": [{**p.to_dict(), **self.note(p).to_dict()} for p in self.problems],
                "fixes": [f.to_dict() for f in self.fixes]}
