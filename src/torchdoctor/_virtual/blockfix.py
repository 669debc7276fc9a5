"""The fix of a ``virtual_devices`` block (and of ``simulate``'s block of a target), by parts, each proven at the
failing ops it changes (``atop``): written and imported only for a block that recorded problems."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from torchdoctor._report.model import Problem
from torchdoctor._virtual.prove import Fix

__all__ = ["proven_fixes"]


def proven_fixes(session: Any, problems: Sequence[Problem] | None = None,
                 current: Mapping[str, tuple[torch.dtype, torch.device]] | None = None) -> tuple[Fix, ...]:
    """The fix of a block by parts (of ``problems``, the session's by default), each proven at the failing ops it
    changes (or saying what was tried). ``current``: the tensors' dtype and device after the run, by path (the
    outermost module's, by default, when a dtype was asked for): a device fix of a tensor also in the wrong dtype
    casts it too. The fixes know a patched network by its walk path (``….forward.__self__.…``)."""
    from torchdoctor._virtual.assigned import assign_fixes
    from torchdoctor._virtual.atop import prove_at_ops  # the proof machinery: only for a block with problems
    from torchdoctor._virtual.callmove import placed_fixes
    from torchdoctor._virtual.curdev import bare_move_fixes
    from torchdoctor._virtual.handover import handed_fixes
    from torchdoctor._virtual.hooked import mapped_paths
    from torchdoctor._virtual.keptplace import kept_fixes
    from torchdoctor._virtual.directread import direct_reads
    from torchdoctor._virtual.metamade import meta_made
    from torchdoctor._virtual.intrefused import refusal_fixes
    from torchdoctor._virtual.modcast import at_cast_lines
    from torchdoctor._virtual.prove import held

    rec = session._rec
    walked = {new: old for old, new in session.renamed.items()}
    problems = [replace(p, path=walked[p.path]) if p.path in walked else p
                for p in (session.problems if problems is None else problems)]
    roots = rec.modules.outermost
    # the model: the outermost module holding the most tensors; the others ran apart from it (a pipeline's ControlNet)
    main = max(roots, key=lambda m: len(m.state_dict(keep_vars=True)), default=None) if roots else None
    if current is None and main is not None:  # no-op casts left out, a component in another dtype named
        try:
            current = held(main)
        except Exception:  # a strange object: the fix is written without it
            current = None
    from torchdoctor._virtual.fixes import fix_items  # the fix is written only for a block that has problems
    apart = [a for a in rec.entry.outer.values() if a.module() is not None and a.module() is not main]
    made, problems = meta_made(problems, session.sources, rec.entry.made_args)  # a factory of the program's on meta
    read, problems = direct_reads(problems, current, rec.cases.cases)  # a layer's tensor read at the program's line
    made += read
    items = at_cast_lines(made + (fix_items(problems, session.device, session.dtype, session.sources, current, None,
                                            apart, rec.entry.made_args, cases=rec.cases.cases,
                                            mapped=mapped_paths(main)) or [] if problems else []),
                          session._casts, main)
    items = handed_fixes(items, rec.cases.cases)  # a module kept elsewhere on purpose: its output moved where handed
    items = kept_fixes(items, main, rec.cases.cases, rec.entry.given)  # ... and its inputs moved to it where it is called
    items = placed_fixes(items, main, session.device, problems, rec)  # parked arguments moved at the call; hooked
    items = bare_move_fixes(refusal_fixes(problems, items), problems, main)  # a kernel-refused int, a bare .cuda()
    items = assign_fixes(items, main)  # a model a load with assign=True put back on the cpu: that line fixed
    from torchdoctor._virtual.dropped import dropped_fixes

    from torchdoctor._virtual.island import autocast_off_fixes, island_fixes

    items = island_fixes(dropped_fixes(_beside_library(_against_kept(items))), rec.cases.cases)
    items = autocast_off_fixes(items, rec.cases.cases)  # a block run with autocast off: its input cast there
    from torchdoctor._virtual.keptcall import kept_call_fixes

    items = kept_call_fixes(items, rec.cases.cases)  # a layer whose output the line moves at once: its input moved  # a library's own factory line is never the fix beside one at the
    # program's line; a model kept in its dtype on purpose is never cast out of it beside the fix of its input
    try:  # (a caller's integer argument, a timestep the model makes float itself, is never cast to a float dtype)
        return tuple(f for f in prove_at_ops(items, rec.cases.cases, rec.rules, rec.profile, rec.entry.inputs)
                     if not (f.kind == "input" and isinstance(f.target, torch.dtype) and f.label in rec.entry.ints))
    except Exception as exc:  # the proof is extra: the fix stands, said unproven, never a crash of the report
        for f in items:
            f.proven, f.tried = False, f"the proof at the failing op failed: {type(exc).__name__}: {exc}"[:400]
        return tuple(items)


def _beside_library(items: list[Any]) -> list[Any]:
    """``items`` without the fixes of factories at an installed library's line (``torch.tensor`` in transformers'
    cache, fed a float32 stream) when a fix at the program's own line is among them (the odd input cast where the
    model is handed it): the library's line only follows that stream, and its code is not the program's to edit."""
    from torchdoctor._virtual.libout import library_line

    def library(f: Any) -> bool:
        keys = [k for k, _ in f.sets] if f.sets else []
        return bool(keys) and all(isinstance(k, str) and k.startswith("factory ") and " at " in k and
                                  library_line(k.rpartition(" at ")[2]) for k in keys)

    own = [f for f in items if not library(f)]
    return own if any(getattr(f, "diff", None) for f in own) else items


def _against_kept(items: list[Any]) -> list[Any]:
    """``items`` without casts of model tensors away from the dtype a component is kept in on purpose, when the fix
    of the input handed to it is among them (``keptside``): what its ops met was that input's stream, and casting
    its weights to the stream's dtype undoes the program's own choice."""
    from torchdoctor._virtual.keptfix import KEPT

    kept = {f.target for f in items if isinstance(f.target, torch.dtype) and
            any(isinstance(k, str) and k.startswith(KEPT) for k, _ in f.sets or ())}
    if len(kept) != 1:
        return items
    (home,) = kept
    return [f for f in items if not (f.kind == "path" and f.sets and
                                     all(isinstance(t, torch.dtype) and t != home for _, t in f.sets))]
