"""A submodule the program assigned after the model was cast (``net.out = nn.Linear(8, 2)`` after
``net.to(torch.bfloat16)``): every tensor the failure names is one that assignment put there, so the fix is that
line given the model's value (``net.out = nn.Linear(8, 2).to(torch.bfloat16)``), with its diff when the line is the
program's own. Read from an active ``torchdoctor.trace`` (the run verb keeps one); None without it."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchdoctor._guard.ownfile import own_file


def assigned_fix(paths: Sequence[str], by_path: Mapping[str, Any], target: Any) -> tuple[str, str | None] | None:
    """(the assignment line fixed, its diff) when every one of ``paths`` is a tensor of one submodule whose last
    recorded change is the program's ``.<name> =`` at one line, and every floating tensor of that submodule is
    among them; None otherwise."""
    from torchdoctor import _trace
    from torchdoctor._guard.maps import value_code
    from torchdoctor._report.diff import line_patch

    owners = {p.rpartition(".")[0] for p in paths}
    if len(owners) != 1 or not _trace.active() or target is None:
        return None
    owner = owners.pop()
    name = owner.rpartition(".")[2]
    mine = [p for p, t in by_path.items() if p.rpartition(".")[0] == owner and isinstance(t, torch.Tensor)
            and t.is_floating_point()]
    if not name or set(mine) != set(paths):
        return None  # the submodule holds tensors the failure did not name: its own fix is not this line's
    recs = [_trace.record_for(by_path[p]) for p in paths]
    where = {(r.file, r.line) for r in recs if r is not None and r.call == f".{name} =" and r.kind in ("add", "move")}
    if len(where) != 1 or any(r is None for r in recs):
        return None
    file, line = where.pop()
    if file is None or line is None or not own_file(file):
        return None
    raw = _read(file, line)
    m = re.match(rf"^(\s*[\w.]+\.{re.escape(name)}\s*=\s*)(.+?)(\s*#.*)?$", raw or "")
    if m is None or "#" in m.group(2) or m.group(2).rstrip().endswith(("\\", "(", ",")):
        return None
    new = f"{m.group(1)}{m.group(2).rstrip()}.to({value_code(target)})"
    return f"{new.strip()}  # {os.path.basename(file)}:{line}", line_patch(file, line, new + (m.group(3) or ""))


def trace_note(t: torch.Tensor) -> str:
    """What an active ``torchdoctor.trace`` knows of how this tensor got where it is (the call and line)."""
    try:
        from torchdoctor import _trace

        note = _trace.note_for(t) if _trace.active() else None
    except Exception:  # the trace is extra: the culprit stands without it
        note = None
    return f"  ({note})" if note else ""


def _read(path: str, lineno: int) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            for i, text in enumerate(fh, 1):
                if i == lineno:
                    return text.rstrip("\r\n")
    except OSError:
        return None
    return None
