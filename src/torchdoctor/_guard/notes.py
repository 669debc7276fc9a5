"""One op's problem told in every mode: strict raises the report, fix and warn keep it beside what they aligned.
Either way it names the culprit (by data flow), the maker of an operand made in a forward (``_guard.maker``), the fix
aimed there with its proof and its diff (``_guard.remedy``). ``Note`` is what a recorded problem or fix carries
beyond its ``Problem`` fields; ``GuardReport`` is ``guard.report()``: every problem and fix with its note, as JSON-ready
data.

Told once per distinct problem (module, op, kind, tensors): fix mode meets the same op on every call, and naming the
maker reads frames and source, which only the first call pays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from torchdoctor._guard import component as _component
from torchdoctor._guard.maps import Maps, both, fix_code, module_label, value_str as _value_str, value_str_of
from torchdoctor._guard.proof import prove
from torchdoctor._guard.remedy import Aim, aimed, caller_lines, with_patch
from torchdoctor._placement import dtype_str
from torchdoctor._report.model import PlacementError, Problem
from torchdoctor._report.text import format_error
from torchdoctor._rules import registry as _rules


@dataclass(frozen=True)
class Note:
    """What guard said of a problem beyond its ``Problem`` fields: where the operand was made (one line per maker),
    the fix as code, its proof ("fix proven: ..." / "fix unproven: ..." with what was tried) and its diff."""

    maker: str | None = None
    fix: str | None = None
    proof: str | None = None
    patch: str | None = None
    groups: tuple[str, ...] = ()  # the components the fix casts whole (fix / warn tell their later ops once)

    @property
    def proven(self) -> bool:
        return bool(self.proof and self.proof.startswith("fix proven"))

    def to_dict(self) -> dict[str, Any]:
        return {"maker": self.maker, "fix": self.fix, "proven": self.proven, "proof": self.proof,
                "patch": self.patch}


NOTHING = Note()


def key_of(p: Problem) -> tuple[Any, ...]:
    """The identity guard records a problem under (kind, path, module, op)."""
    return (p.kind, p.path, p.module_path, p.op)


@dataclass
class Case:
    """What ``Session.on_problem`` gathered about one op: its call, the findings aligned per target, the operands'
    labels, culprits and report lines, and the operands that are no model tensor (made in a forward, or given)."""

    func: Any
    args: Sequence[Any]
    kwargs: Mapping[str, Any]
    op: Any
    findings: list[_rules.Finding]
    plan: list[tuple[_rules.Finding, Any, list[_rules.Key]]]
    tensors: dict[Any, Any]
    problems: list[Problem]
    culprits: list[tuple[str | None, str, str, Any]]
    lines: list[str]
    loose: list[torch.Tensor]
    made: list[tuple[str, torch.Tensor]]
    given: list[tuple[str, torch.Tensor]]
    maps: Maps | None
    mod: Any
    root: Any
    mpath: str | None
    mtype: str | None
    compiled: bool
    fixable: bool
    extra: dict[str, Any] = field(default_factory=dict)


def told(session: Any, c: Case) -> tuple[PlacementError, Note]:
    """The report of ``c`` (raised by strict, and by fix when nothing can be aligned) and its ``Note``."""
    maps, op, plan, tensors = c.maps, c.op, c.plan, c.tensors
    lines, culprits, problems = list(c.lines), list(c.culprits), list(c.problems)
    first = problems[0] if problems else c.findings[0].problem
    where = module_label(c.mpath, c.mod) + (f" ({c.mtype})" if c.mtype else "") if c.mod is not None else "code outside any module"
    f0, t0, ks0 = plan[0]
    detail = c.findings[0].problem.message.split(": ", 1)[-1]
    if ks0 and (t0 != f0.target or ks0 != list(f0.offenders)):  # aligned on the model, not on an operand
        detail = (f"{', '.join(_rules.label(op, k) for k in ks0)} {'is' if len(ks0) == 1 else 'are'} "
                  f"{_value_str(tensors[ks0[0]], f0.attr)}, expected {value_str_of(t0)} like the model")
    head = f"{first.kind} problem in {where} at {op}: {detail}"
    # in fix / warn a tensor aligned before this op never reached it with its wrong value: never the culprit here
    own = {x[0] for x in culprits} | set(session.g._fixed)
    sus = session._blame(maps, first.kind, {p.found for p in problems}, c.mpath, own, c.loose, c.compiled)
    blamed = [b for b in sus if b.culprit]
    if blamed:
        from torchdoctor._guard.provenance import headline, target_of

        head = headline(blamed[0], first.kind, where, f"at {op}: {detail}")
        lines = [b.line() for b in blamed] + lines
        culprits = [(b.problem.path, b.problem.path, b.problem.kind, target_of(b.problem))
                    for b in blamed] + [x for x in culprits if x[0] is not None]
        problems = [replace(b.problem, op=str(op)) for b in blamed] + problems
    lines += [b.line() for b in sus if not b.culprit]
    others = [d for d in c.findings[0].problem.tensors if not any(d.startswith(_rules.label(op, k) + ":")
                                                                  for _, _, ks in plan for k in ks)]
    culprits = both(maps, culprits)  # a tensor off in device and in dtype: one fix for both
    fix, proof = fix_code(culprits, maps.dicts if maps is not None else ()), None
    if not blamed and first.kind == "dtype" and maps is not None and all(x[0] is None for x in culprits):
        # a float32 component fed reduced-precision data by the rest of the pipeline: cast the component
        # (as explain mode says), not the data flowing in (_guard/component.py)
        from torchdoctor._guard.provenance import odd_component

        fed = [tensors[k] for _, _, ks in plan for k in ks if isinstance(tensors[k], torch.Tensor)]
        odd = odd_component(maps.walk, c.mpath, fed, t0)
        if odd is not None:
            head = f"dtype problem in {where} at {op}: `{odd[0] or '<root>'}` runs in float32 while the data " \
                   f"flowing in is {dtype_str(odd[1])}"
            lines, fix, comp = _component.blame(odd, lines, c.root, maps.dicts, c.mpath, c.mtype, str(op))
            problems = [comp, *problems]
            proof = _component.prove_op(c.func, c.args, c.kwargs, tensors, odd[1], op)
    aim: Aim | None = aimed(c.made, first.kind, t0, maps.modules, maps.dicts, session.frames) \
        if c.made and not blamed and maps is not None else None
    said = caller_lines(c.given, first.kind, inside=maps.modules if maps is not None else None)
    lines += said
    if aim is not None:  # the maker of an operand made in forward: the fix is aimed at it (_guard/remedy.py)
        lines += aim.lines
        fix = aim.code or fix
    if fix is not None:  # tried before it is shown: a re-run with the maker fixed, else the failing op
        lines.append(proof or (aim.proof if aim is not None and aim.proof else prove(
            c.func, c.args, c.kwargs, plan, tensors, op) if c.fixable or session.mode == "strict"
            else "fix unproven: no alignment of this op is known"))
        held = [(x[0], x[3]) for x in culprits if x[0] is not None]
        if proof is None and aim is None and maps is not None and held and not session.replaying \
                and len({t for _, t in held}) == 1 and lines[-1].startswith("fix proven"):
            # a fix that breaks a later op is not proven: the whole forward again, the odd submodule cast whole
            was = fix
            fix, more, whole = _component.widen(session, maps, c.root, list(dict.fromkeys(p for p, _ in held)),
                                                held[0][1], fix, session.mode == "strict" or bool(blamed))
            if more or (whole is not None and (whole.startswith("fix unproven") or fix != was)):
                lines[-1:] = more + [whole or lines[-1]]
            elif whole is not None:  # both proven: the op's own proof stays the last word on this op
                lines.insert(-1, whole)
    lines = _component.fold_also(lines)  # the odd component's other tensors are counted in its one finding
    err = PlacementError(format_error(head, lines + [f"other operand {d}" for d in others], fix),
                         module_path=c.mpath, module_type=c.mtype, op=str(op),
                         tensors=tuple(c.findings[0].problem.tensors), problems=problems, fix=fix)
    err = with_patch(err, aim.patch if aim is not None else None, lines)
    makers = (aim.lines if aim is not None else []) + said
    return err, Note("\n".join(makers) or None, fix, err.proof, err.patch, tuple(_component.groups_of(lines)))


def said(note: Note) -> str:
    """What a warning adds of its note: the maker, the fix and whether it was proven (one line)."""
    out = ""
    if note.maker:
        out += "; " + note.maker.replace("\n", "; ")
    if note.fix:
        out += f"; fix ({'proven' if note.proven else 'unproven'}): " + note.fix.replace("\n", "; ")
    return out


@dataclass(frozen=True)
class GuardReport:
    """``guard.report()``: what one guard saw, as fields (``problems``, ``fixes``, the ``Note`` of each problem by
    ``key_of``) and as JSON-ready data (``to_dict``)."""

    mode: str
    problems: tuple[Problem, ...]
    fixes: tuple[Any, ...]
    notes: Mapping[tuple[Any, ...], Note]

    def note(self, p: Problem) -> Note:
        return self.notes.get(key_of(p), NOTHING)

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "ok": not self.problems,
                "problems": [{**p.to_dict(), **self.note(p).to_dict()} for p in self.problems],
                "fixes": [f.to_dict() for f in self.fixes]}
