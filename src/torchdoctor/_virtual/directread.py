"""A model tensor the program's own line reads directly, outside any forward, where the app keeps its layer on
another device (ComfyUI's lowvram partial load leaves layers on the cpu and casts their weights per call in the
layer's own forward; a custom node that computes ``image_embeds @ proj.weight.t() + proj.bias`` meets them there):
the tensors are moved where that line reads them (``proj.weight.to(image_embeds.device)``), a diff, with the device
of a tensor the line reads on the device. A move of the layer, or of the whole model, would undo the app's placement
(the next load puts it back). Proven at the failing ops with those tensors moved (their paths)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchdoctor._report.model import Problem
from torchdoctor._virtual.prove import Fix

__all__ = ["direct_reads"]


def direct_reads(problems: Sequence[Problem], have: Mapping[str, Any] | None,
                 cases: Sequence[Any]) -> tuple[list[Fix], list[Problem]]:
    """(one fix per program line that reads model tensors directly off the run's device, the problems left)."""
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._placement import parse_device
    from torchdoctor._virtual.feeder import operands

    lines: dict[tuple[str, int], list[tuple[Problem, Any]]] = {}
    rest: list[Problem] = []
    for p in problems:
        case = next((c for c in cases if c.line is not None and own_file(c.line[0]) and
                     any(p.path in o.tags for o in operands(c.before))), None) \
            if p.kind == "device" and p.role == "activation" and p.module_path is None and p.path in (have or {}) \
            else None
        try:
            target = parse_device(p.expected) if case is not None else None
        except (ValueError, TypeError, RuntimeError):
            target = None
        if case is None or target is None:
            rest.append(p)
            continue
        lines.setdefault(case.line, []).append((p, case))
    out: list[Fix] = []
    for (file, line), hits in lines.items():
        fix = _at_line(file, line, hits)
        if fix is None:
            rest.extend(p for p, _ in hits)
        else:
            out.append(fix)
    return out, rest


def _at_line(file: str, line: int, hits: list[tuple[Problem, Any]]) -> Fix | None:
    import linecache

    from torchdoctor._placement import device_str, parse_device
    from torchdoctor._report.diff import line_patch

    raw = linecache.getline(file, line).rstrip("\r\n")
    target = parse_device(hits[0][0].expected)
    like = next((n.name for _, c in hits for n in getattr(c, "names", ()) if str(n.device) == str(target)), None)
    to = f"{like}.device" if like else repr(device_str(target))
    new = raw
    for p, _ in hits:
        attr = p.path.rsplit(".", 1)[-1]
        reads = list(re.finditer(rf"(?<![\w.])[A-Za-z_][\w.\[\]]*\.{re.escape(attr)}\b(?!\s*[=(])", new))
        if len(reads) != 1:
            return None
        end = reads[0].end()
        new = new[:end] + f".to({to})" + new[end:]
    diff = line_patch(file, line, new)
    if diff is None:
        return None
    paths = ", ".join(dict.fromkeys(p.path for p, _ in hits))
    at = getattr(hits[0][1], "at", None) or f"{file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{line}"
    return Fix(f"{new.strip()}  # {at} reads {paths} directly, outside the layer's forward, where the app "
               f"keeps it on {hits[0][0].found}: moved where it is read (a move of the layer would undo the app's "
               "placement)", "note", target, sets=tuple((p.path, target) for p, _ in hits), diff=diff)
