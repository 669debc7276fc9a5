"""A device fix that would leave a silent promotion: a float32 mask made from numpy on the host meets float16 latents
on the device (``latent * mask``). Moving the mask alone makes the product float32 without an error, so the fix of
the line that made it moves it and casts it to the dtype of what it meets (``.to(latent.device, latent.dtype)``),
and a cast the line made to the wider dtype (``.float()`` after ``torch.from_numpy``) is dropped from it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

import torch

from torchdoctor._placement import FLOAT8_DTYPES, parse_dtype

# ``arg 1 (other): f32[8,8]@cpu (...)``: an operand of the failing op as a problem lists it
_OPERAND = re.compile(r":\s*([a-z0-9_]+)\[([^\]]*)\]@([a-z]+(?::\d+)?)")
FLOATS = ("float32", "float64", "float16", "bfloat16")  # the wide dtypes a cast on the maker's line may have set
_CASTS = {"float": torch.float32, "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16}


def narrower_partner(tensors: Sequence[str], found: str, expected: str) -> tuple[torch.dtype, torch.dtype] | None:
    """(the wide dtype of the operand on ``found``, the narrower floating dtype of an operand on ``expected`` it
    would promote once moved there), or None: nothing would be promoted (same dtype, integers, a 0-dim scalar)."""
    wide: list[torch.dtype] = []
    narrow: list[torch.dtype] = []
    for text in tensors:
        m = _OPERAND.search(text)
        if m is None:
            continue
        try:
            dt = parse_dtype(m.group(1))
        except ValueError:
            continue
        if not dt.is_floating_point or dt in FLOAT8_DTYPES or not m.group(2):  # a 0-dim tensor promotes nothing
            continue
        (wide if m.group(3) == found else narrow if m.group(3) == expected else []).append(dt)
    if len(set(wide)) != 1 or len(set(narrow)) != 1:
        return None
    w, n = wide[0], narrow[0]
    return (w, n) if w != n and torch.promote_types(w, n) == w else None


def drop_cast(raw: str, pad: int, call: ast.Call, tree: ast.AST, wide: torch.dtype) -> str:
    """``raw`` without the cast to ``wide`` applied right to ``call`` (``torch.from_numpy(a).float()``: ``.float()``
    goes, the fix's ``.to(device, dtype)`` casts instead); unchanged when there is none."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.value is call):
            continue
        attr = node.func.attr
        to_wide = attr == "to" and len(node.args) == 1 and not node.keywords and \
            ast.unparse(node.args[0]) in (f"torch.{str(wide)[6:]}", "torch.float" if wide == torch.float32 else "")
        if (_CASTS.get(attr) == wide and not node.args and not node.keywords or to_wide) and \
                call.end_col_offset is not None and node.end_col_offset is not None:
            return raw[:pad + call.end_col_offset] + raw[pad + node.end_col_offset:]
    return raw
