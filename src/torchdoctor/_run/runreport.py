"""What ``torchdoctor run`` found, as text and JSON: ``RunReport``.

A plain class, not a dataclass: a dataclass compiles its methods at import, and this module is imported before the
program's first line. What only a report with problems prints (the grouping, the fixes' proof labels, the merged
patch) is imported when it is printed.
"""

from __future__ import annotations

from typing import Any

from torchdoctor._run.watch import Finding


class RunReport:  # a plain class: a dataclass compiles its methods at import, before the program's first line
    """What ``torchdoctor run`` found: ``findings`` (each distinct placement error met), ``problems`` (a virtual
    run's recorded placement problems), the program's ``exit_code``."""

    def __init__(self, program: list[str], exit_code: int, findings: list[Finding] | None = None,
                 problems: list[Any] | None = None, device: str | None = None, seconds: float = 0.0,
                 stopped: str | None = None, where: dict[tuple[str, ...], str | None] | None = None,
                 notes: dict[str, str] | None = None, expected: dict[str, str] | None = None,
                 missing: str | None = None, ran: str | None = None, networks: tuple[str, ...] = (),
                 fixes: tuple[Any, ...] = ()) -> None:
        self.program = program
        self.exit_code = exit_code
        self.findings = findings if findings is not None else []
        self.problems = problems if problems is not None else []
        self.device = device
        self.seconds = seconds
        self.stopped = stopped
        self.where = where if where is not None else {}  # (kind, path) -> the program's line
        self.notes = notes if notes is not None else {}  # path -> the trace's last move or cast of that tensor
        self.expected = expected if expected is not None else {}  # device/dtype/profile -> "value (from where)"
        self.missing = missing  # `-m NAME` named no runnable module (python's line): the program never ran
        self.ran = ran  # where a virtual run's work really ran ("ran on cuda:1", or the device the program picked)
        self.networks = networks  # networks patched into a model's forward, by the names the program holds them
        # the virtual run's fix by parts (``_virtual.prove.Fix``), each proven at the op or not; one fix found by two
        # problems of one cause (a tensor that reaches two ops) is listed once
        self.fixes = tuple({(f.code, f.diff, f.proven): f for f in fixes}.values())
        if any(f.fix and _proven(f) for f in self.findings):  # the raised error's proven fix covers what no fix
            self.fixes = tuple(f for f in self.fixes if not f.code.startswith("# no fix found"))  # was found for
        self.internal: list[str] = []  # torchdoctor's own warnings while the program ran, one line each
        self.raised: Any = None  # the error that ended a program with nothing placed wrong (``_run.raised``)
        self.hooks: dict[str, str] = {}  # path -> an offload hook above it that the op went around
        self.roots: list[tuple[str, frozenset[str], frozenset[str]]] = []  # outermost modules: class name,
        # parameter/buffer paths, the devices they are on at the end
        if any("Recomputed values" in f.error for f in self.findings):  # a checkpoint's recompute in another dtype:
            from torchdoctor._virtual.defaultdtype import aim  # the default-dtype factory the run noted, if any

            for f in self.findings:
                aim(f)

    def __repr__(self) -> str:
        return (f"<RunReport of {' '.join(self.program)[:80]!r}: exit {self.exit_code}, {len(self.findings)} "
                f"finding(s), {len(self.problems)} problem(s)>")

    @property
    def ok(self) -> bool:
        return not self.findings and not self.problems

    def _at(self, p: Any) -> str | None:
        """The program's line where ``p`` was recorded: two roots may hold one path (an Embedding's ``weight`` and a
        Linear's), so the module's own stack first."""
        return self.where.get((p.kind, p.path, p.module_type or "", p.op or "")) or \
            self.where.get((p.kind, p.path, p.module_type or "")) or self.where.get((p.kind, p.path))

    def to_dict(self) -> dict[str, Any]:
        from torchdoctor._report.text import schema

        return {"schema": schema("run"), "ok": self.ok, "program": self.program, "exit_code": self.exit_code,
                "device": self.device, "seconds": round(self.seconds, 3),
                "findings": [{**f.to_dict(), "proven": _proven(f)} for f in self.findings],
                "problems": [{**p.to_dict(), "where": self._at(p),
                              "trace": self.notes.get(p.path), "hook": self.hooks.get(p.path)}
                             for p in self.problems],
                "causes": [c.to_dict() for c in self._causes()],
                "fixes": [f.to_dict() for f in self.fixes] + [_finding_fix(f) for f in self.findings if f.fix],
                "patch": self.patch(),
                "stopped": self.stopped, "expected": self.expected, "ran": self.ran, "internal": self.internal,
                "raised": self.raised.to_dict() if self.raised is not None else None}

    def _causes(self) -> list[Any]:
        """The problems by cause: one line per tensor or model however many ops met it (the JSON keeps each)."""
        if not self.problems:
            return []
        from torchdoctor._run.onecause import causes
        from torchdoctor._virtual.groups import grouped

        shown, _ = grouped(self.problems, 0, self.networks)  # one module type's tensors first, then one cause
        return causes(shown, self.roots)

    def patch(self) -> str | None:
        """Every fix that is a change of the program's own files (the virtual run's and guard's), as one unified diff
        that ``git apply`` takes whole: one diff per fix would not apply together where two fixes are near."""
        if self.fixes:  # the proof machinery loads only for a run with fixes
            from torchdoctor._virtual.prove import refuted
        diffs = [d for d in [*(getattr(f, "diff", None) for f in self.fixes if not refuted(f)),
                             *(f.diff for f in self.findings)] if d]
        if len(diffs) < 2:
            return diffs[0] if diffs else None
        from torchdoctor._report.diff import merged

        return merged(diffs)

    def text(self) -> str:
        where = f" on virtual {self.device}" if self.device else ""
        head = f"torchdoctor run: {' '.join(self.program)}{where} exited with {self.exit_code} ({self.seconds:.1f} s)"
        ran = f"; {self.ran}" if self.ran else ""
        if self.ok and self.raised is not None:  # never an all-clear after a traceback
            return "\n".join([f"{head}: {self.raised.lines(self.device)[0]}{ran}", *self.raised.lines(self.device)[1:],
                              *(f"note: {n} (torchdoctor's own limit; the program ran as without it)"
                                for n in self.internal)])
        if self.ok:
            return "\n".join([f"{head}: no placement error{ran}",
                              *(f"note: {n} (torchdoctor's own limit; the program ran as without it)"
                                for n in self.internal)])
        causes = self._causes()
        one = f" ({len(causes)} cause(s))" if len(causes) < len(self.problems) else ""
        lines = [f"{head}: {len(self.findings)} placement error(s) met, {len(self.problems)} problem(s) recorded{one}"
                 f"{ran}"]
        if self.expected:
            lines.append("expected: " + "; ".join(f"{k} {v}" for k, v in self.expected.items()))
        lines += [f.text() for f in self.findings]
        for c in causes[:40]:
            p = c.shown
            lines.append(f"[{p.kind}] {p.path}: {p.message}")
            at = self._at(p) or self._at(c.first)  # a cause folded here: the line its first member was met at
            if p.tensors and not at:  # a group: the line its first member was recorded at
                first = next((self.where.get((p.kind, t)) for t in p.tensors if self.where.get((p.kind, t))), None)
                if first:
                    lines.append(f"  recorded at {first}")
            if at:
                lines.append(f"  recorded at {at}")
            note = self.notes.get(p.path) or next((self.notes[t] for t in [c.first.path, *c.members]
                                                   if t in self.notes), None)
            if note:
                lines.append(f"  last change: {note}")
            hook = next((self.hooks[t] for t in [p.path, c.first.path, *c.members] if t in self.hooks), None)
            if hook:
                lines.append(f"  offloaded: {hook}")
        lines += [f"note: {n} (torchdoctor's own limit; the program ran as without it)" for n in self.internal]
        if self.stopped:
            lines.append(f"  the virtual run stopped early: {self.stopped}")
        if self.fixes:  # each fix with its proof label, as simulate prints them (--json carries the same)
            from torchdoctor._virtual.prove import fix_text

            lines += _once(fix_text(list(self.fixes)))
        return "\n".join(lines)


def _once(block: list[str]) -> list[str]:
    """The fix block with a code line said once: four tensors of one kind get one
    ``# pass the tensors made on cpu as tensor.to('cuda:0')``, not four (a diff after ``Patch`` is kept whole)."""
    out: list[str] = []
    seen: set[str] = set()
    for i, line in enumerate(block):
        if line.startswith("Patch"):
            return out + block[i:]
        if line.startswith("    ") and line.strip() and line in seen:
            continue
        seen.add(line)
        out.append(line)
    return out


def _proven(f: Any) -> bool | None:
    """Whether a finding's fix was proven, as its ``fix proven`` / ``fix unproven`` line says (in the culprit's text
    or the fix's, as a comment or not); None when none says."""
    lines = (x.strip().removeprefix("#").strip() for x in f"{f.culprit or ''}\n{f.fix or ''}".splitlines())
    said = [x for x in lines if x.startswith(("fix proven", "fix unproven"))]
    return said[0].startswith("fix proven") if said and f.fix else None


def _finding_fix(f: Any) -> dict[str, Any]:
    """A raised error's fix in the JSON's ``fixes``, as the virtual run's are listed (``kind``: ``finding``)."""
    out: dict[str, Any] = {"code": f.fix, "kind": "finding", "proven": bool(_proven(f)), "tried": ""}
    if f.diff:
        out["diff"] = f.diff
    return out

