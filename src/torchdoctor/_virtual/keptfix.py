"""The fix of an input handed to a component the program keeps in its own dtype or on its own device on purpose
(``keptside`` decides it at the failing op): the program's line that hands it over, the input cast or moved there
(``self.vae.decode(latents.to(self.vae.dtype) / …)``), a diff; proven at the failing op on copies of its operands
with the input so (its twin carries the site's tag), the run having gone on with it so."""

from __future__ import annotations

from typing import Any

__all__ = ["KEPT", "Kept", "RECORDS", "kept_fix"]

KEPT = "kept component "  # a problem's source: the use site a ``Kept`` record fixes
RECORDS: dict[str, Kept] = {}  # source tag -> its record (bounded by ``keptside``)


class Kept:
    """One use site: the program's line, the line fixed, the component as the program names it, its class, why it
    is kept so, the input's names and makers, and the dtype or device it keeps. A plain class (read once per run)."""

    __slots__ = ("kind", "target", "file", "line", "at", "new", "recv", "cls", "why", "odd", "found", "makers")

    def __init__(self, kind: str, target: Any, file: str, line: int, at: str, new: str, recv: str, cls: str,
                 why: str, odd: tuple[str, ...], found: str, makers: tuple[str, ...]) -> None:
        self.kind, self.target, self.file, self.line, self.at, self.new = kind, target, file, line, at, new
        self.recv, self.cls, self.why, self.odd, self.found, self.makers = recv, cls, why, odd, found, makers


def kept_fix(tag: str) -> Any:
    """The use site's fix for ``tag`` (a ``Kept`` record): the line fixed, a diff; None when the record is gone."""
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.prove import Fix

    k = RECORDS.get(tag)
    if k is None:
        return None
    said = ", ".join(f"{n} ({k.found}{m})" for n, m in zip(k.odd, k.makers))
    verb = "cast" if k.kind == "dtype" else "moved"
    code = (f"{k.new.strip()}  # at {k.at}: {k.why}; {said} {'is' if len(k.odd) == 1 else 'are'} made for "
            f"another component: {verb} where {k.recv} is handed {'it' if len(k.odd) == 1 else 'them'}, never "
            f"{k.recv} itself")
    diff = line_patch(k.file, k.line, k.new)
    again = (k.file, k.line, k.odd[0], None, k.target) if k.kind == "dtype" and len(k.odd) == 1 else None
    # judged at the failing op (``atop``) on its twin, which carries the tag; a re-run casts it at the line
    return Fix(code, "note", k.target, diff=diff, sets=((tag, k.target),), reoperand=again)
