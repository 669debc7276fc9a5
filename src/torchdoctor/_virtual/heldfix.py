"""The fix of a holder whose tensors a library's own line moved away (an offloaded KV cache's layers, named by
``deepheld`` as ``cache.layers[1].keys``): never ``cache.to(...)`` for an object without that method, nor an edit of
the library's line — the library's move named, and the program's own overrides of that library class's methods (a
``prefetch`` that should have brought the layers back) named with their lines. Advice, judged by no re-run."""

from __future__ import annotations

from typing import Any

from torchdoctor._virtual.deepheld import HELD

__all__ = ["held_fix"]


def held_fix(f: Any) -> Any:
    """``f``, a move of a holder (``cache.to('cuda:0')``) whose tensors a library's own line moved away, replaced by
    what the program can change: the library's move named (``DynamicLayer.offload``), and the holder's class's
    overrides of the library's methods when the class is the program's own (its ``prefetch`` that should have
    brought them back); None for any other fix. Advice: judged by no re-run, said so."""
    import linecache
    import os
    import re

    from torchdoctor._virtual.origin import LINES
    from torchdoctor._virtual.prove import Fix

    holder = f.sets[0][0][:-1] if f.kind == "note" and len(f.sets) == 1 and f.sets[0][0].endswith(".") else None
    paths = [p for p in HELD if holder and p.startswith(holder + ".")]
    if not paths or not f.code.startswith(f"{holder}.to("):
        return None
    at, has_to, over = HELD[paths[0]]
    file, line = LINES.get(at, ("", 0))
    func = next((m.group(1) for n in range(line, max(line - 80, 0), -1)
                 if (m := re.match(r"\s*def (\w+)", linecache.getline(file, n)))), None) if file else None
    owner = next((m.group(1) for n in range(line, max(line - 2000, 0), -1)
                  if (m := re.match(r"class (\w+)", linecache.getline(file, n)))), None) if func else None
    by = f"{owner}.{func} ({at})" if owner and func else at
    target = f.sets[0][1]
    many = len(paths) > 1
    shown = ", ".join(paths[:3]) + (" …" if len(paths) > 3 else "")
    for p in paths:
        HELD.pop(p, None)  # said once: a later run's holder of that name is its own
    head = (f"# {shown} {'were' if many else 'was'} moved off {target} by {by}, the library's own code, for the "
            f"{holder} the program made and passed in; {'they meet' if many else 'it meets'} tensors on {target} "
            "before anything moved them back")
    if over is not None:
        cls, own, methods = over
        said = ", ".join(f"{m} ({os.path.basename(own)}:{a}-{b})" for m, a, b in methods)
        return Fix(f"{head}: {holder} is of class {cls}, the program's own, whose {said} "
                   f"override{'s' if len(methods) == 1 else ''} the library's: make {'it' if len(methods) == 1 else 'them'} "
                   "bring back what is used next (the next layer that was moved away), or drop the override; never "
                   "an edit of the library's line", "note",
                   tried=f"not re-run: the change is to the program's own {cls} code; torchdoctor run runs a program "
                         "once (a second run would write its files and output again)")
    move = f"move {holder} to {target} after that call ({holder}.to({str(target)!r}))" if has_to else \
        f"make that call keep them on {target} (the library's offloading switched off)"
    return Fix(f"{head}: {move}; never an edit of the library's line", "note",
               tried="not re-run: the move is the library's own, made inside the program's call")
