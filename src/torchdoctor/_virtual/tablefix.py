"""A library's table kept on the cpu (a scheduler's ``alphas_cumprod``) indexed at the program's line with indices on
the accelerator: ``sched.alphas_cumprod[timesteps]`` raises "indices should be either on cpu or on the same device as
the indexed tensor (cpu)". The library made the table where it keeps it (its ``add_noise`` moves it per call), so its
maker is not the place; the program's line moves the table to its indices' device where it reads it,
``sched.alphas_cumprod.to(timesteps.device)[timesteps]`` (as diffusers' ``compute_snr`` does), a diff of that line.
Proven at the failing op, with the table moved as the fix leaves it.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Any

import torch

from torchdoctor._virtual.prove import Fix

_INDEX = ("aten.index.Tensor", "aten._unsafe_index.Tensor", "aten.index_select.default")


def table_fix(key: str, cases: Sequence[Any], target: torch.device) -> Fix | None:
    """The fix of a cpu table made by a library (``key``: ``factory torch.linspace at schedulers/….py:215``) where
    the program's own line indexes it, or None (the line is not the program's, or holds no one such subscript)."""
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.origin import LINES
    from torchdoctor._virtual.ownline import own_line

    made_file = LINES.get(key.rpartition(" at ")[2], ("", 0))[0]
    if not made_file or own_file(made_file):
        return None
    for c in cases:
        if str(c.op) not in _INDEX or c.line is None or not own_file(c.line[0]):
            continue
        read = own_line(*c.line)
        if read is None or not read[0].isascii():
            return None
        raw, body, tree = read
        subs = [n for n in ast.walk(tree) if isinstance(n, ast.Subscript) and _chain(n.value) and _chain(n.slice)]
        if len(subs) != 1 or subs[0].value.end_col_offset is None:
            return None
        sub, pad = subs[0], len(raw) - len(body)
        idx = ast.unparse(sub.slice)
        end = pad + int(sub.value.end_col_offset or 0)
        new = raw[:end] + f".to({idx}.device)" + raw[end:]
        diff = line_patch(c.line[0], c.line[1], new.strip())
        if diff is None:
            return None
        table = ast.unparse(sub.value)
        return Fix(f"{new.strip()}  # {c.at}: {table} is kept on cpu by the library that made it ({key[8:]}); "
                   f"{idx} is on {target}: move the table to its indices' device where the line reads it", "note",
                   target, sets=((key, target),), diff=diff)
    return None


def _chain(node: ast.expr) -> bool:
    """``timesteps``, ``self.sched.alphas_cumprod``: a name or an attribute chain."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)
