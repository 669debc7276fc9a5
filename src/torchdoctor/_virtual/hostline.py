"""A move of a model's parameter or buffer that a factory of the program made on the CPU in the run
(``hostmade``), replaced by the fix at that factory's line: ``torch.from_numpy(...).to('cuda:0')`` where a buffer is
registered under a ``torch.device`` context it ignores, ``torch.empty(..., device=...)`` where a state dict is filled
to be loaded with ``assign=True``. Proven as a factory fix is: at the failing op (the tensors it makes are on the
device) and, in ``simulate``, by a re-run with the line changed (``remake``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchdoctor._virtual.hostmade import maker, recorded
from torchdoctor._virtual.prove import Fix


def made_lines(fixes: Sequence[Fix], root: Any) -> list[Fix]:
    """Each move of a model tensor (``model.table.data = ...to('cuda:0')``) whose tensor a factory of the program
    made on the CPU in this run, replaced by the fix at that factory's line (one per line, for every tensor it
    made); the model's other tensors keep their move."""
    if not recorded() or not isinstance(root, torch.nn.Module):
        return list(fixes)
    from torchdoctor._guard.maps import fix_code
    from torchdoctor._virtual.fixes import factory_fix

    out: list[Fix] = []
    for f in fixes:
        if f.kind != "path" or not f.sets or not all(isinstance(t, torch.device) for _, t in f.sets):
            out.append(f)
            continue
        lines: dict[str, list[tuple[str, torch.device]]] = {}
        keep: list[tuple[str, torch.device]] = []
        for path, dev in f.sets:
            hit = maker(_tensor_at(root, path))
            if hit is None or dev.type == "cpu":
                keep.append((path, dev))
            else:
                lines.setdefault(f"factory {hit[0]} at {hit[1]}", []).append((path, dev))
        if not lines:
            out.append(f)
            continue
        if keep:
            out.append(Fix(fix_code([(p, p, "device", d) for p, d in keep]) or f.code, "path", sets=tuple(keep)))
        for key, paths in lines.items():
            fix = factory_fix(key, {"device": ("cpu", paths[0][1])})
            fix.sets = ((key, paths[0][1]), *paths)  # it makes these model tensors on the device: judged so at an op
            op, _, at = key[8:].partition(" at ")
            made = ", ".join(p for p, _ in paths[:3]) + (f" (+{len(paths) - 3} more)" if len(paths) > 3 else "")
            ctx = " (it ignores the torch.device context)" if any(
                (maker(_tensor_at(root, p)) or ("", "", False))[2] for p, _ in paths) else ""
            fix.code = fix.code.replace(f"# {op} made it on cpu", f"# {op} at {at} made {made} on cpu{ctx}", 1)
            out.append(fix)
    return out


def _tensor_at(root: torch.nn.Module, path: str) -> Any:
    prefix, _, leaf = path.rpartition(".")
    try:
        mod = root.get_submodule(prefix) if prefix else root
    except AttributeError:
        return None
    # a parameter or buffer only: a plain attribute is never moved by Module.to, whatever made it (its fix is a
    # buffer, said by its own line)
    return mod._parameters.get(leaf) if leaf in mod._parameters else mod._buffers.get(leaf)
