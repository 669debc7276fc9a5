"""A silent dtype promotion is a problem. An op that mixes floating dtypes runs without error when the result may
promote (``bf16 * fp32 -> fp32``), and the model's compute dtype is lost from there on with no error to explain.
It is reported when the wider operand is one of the model's own tensors that the policy already finds off-policy
(an fp32 plain attribute in a bf16 model), by path, with the fix that casts it: strict raises at the promoting op,
fix and warn align that operand for the op (the result keeps the model's dtype) and record it; explain, which checks
no op, sees the model's output come back wider and re-runs a copy of the model under strict (``_guard/outcome.py``).

Narrowed on purpose: a forward's own upcast (T5's norm computes its variance in float32 from a ``.to(float32)``
copy) mixes dtypes the same way and is intended, so a tensor made in forward is never blamed here, and neither is a
tensor the policy keeps in float32 (``_keep_in_fp32_modules``). Only ops the rules found nothing wrong with reach
this check, and only when their first two operands are tensors of different dtypes: the happy path never gets here.

>>> import torch
>>> wider([torch.bfloat16, torch.float32]), wider([torch.float16, torch.float16])
(torch.float32, torch.float16)
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from torchdoctor._placement import FLOAT8_DTYPES, dtype_str
from torchdoctor._report.model import Problem
from torchdoctor._rules import registry as _rules

Session = Any  # torchdoctor._guard.session.Session (it imports this module)
_CASTS = frozenset({"aten::_to_copy", "aten::copy_", "aten::to", "aten::_copy_from", "aten::_copy_from_and_resize",
                    "aten::copy"})


def wider(dtypes: Iterable[torch.dtype]) -> torch.dtype:
    out: torch.dtype | None = None
    for d in dtypes:
        out = d if out is None else torch.promote_types(out, d)
    assert out is not None
    return out


_MADE: dict[tuple[Any, int], bool] = {}  # (code, line) of the running user statement -> a default-dtype factory?
_BACK: dict[tuple[Any, int], bool] = {}  # (code, line) -> does the statement's result go back to the input's dtype?
# a cast back to the compute dtype written on the result: `.type_as(x)`, `.to(x.dtype)`, `.to(dtype=...)`
_CAST_BACK = re.compile(r"\.type_as\(|\.to\([^()]*\.dtype\b|\.to\(\s*dtype\s*=|\.(half|bfloat16)\(\)")


def _default_factory(t: torch.Tensor) -> bool:
    """Was ``t`` made in the running forward by a factory given no dtype (``torch.ones(n, device=x.device)``,
    ``torch.from_numpy``): the default dtype, nobody's choice? A cast (``x.to(torch.float32)``, ``.float()``) or an
    op on such a copy (``torch.rsqrt(var)``) is a chosen upcast and is never blamed. Read once per source line."""
    import sys

    from torchdoctor._guard.frames import user_frames
    from torchdoctor._guard.maker import find

    f: Any = sys._getframe(1)
    skip = __file__.rsplit("_guard", 1)[0], torch.__file__.rsplit("__init__", 1)[0]
    while f is not None and f.f_code.co_filename.startswith(skip):
        f = f.f_back
    key = (f.f_code, f.f_lineno) if f is not None else None
    if key is not None and key in _MADE:
        return _MADE[key]
    try:
        m = find(user_frames(), t, "dtype")
        made = m is not None and m.default_dtype
    except Exception:  # naming the maker is extra: no finding then
        made = False
    if key is not None:
        if len(_MADE) > 4096:
            _MADE.clear()
        _MADE[key] = made
    return made


def findings(session: Session, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any],
             made: bool = False) -> list[_rules.Finding]:
    """The promotion finding of this op, or none. ``made``: an operand made in the running forward by a factory
    given no dtype (``_default_factory``) is blamed too (guard: its report names the maker and aims the fix there)."""
    name = getattr(getattr(func, "_schema", None), "name", "")
    if name in _CASTS:  # a cast says which dtype it wants: that is no promotion
        return []
    fl = [(k, t) for k, t in _rules._gather(args, kwargs)
          if t.dim() > 0 and t.is_floating_point() and t.dtype not in FLOAT8_DTYPES]
    dtypes = {t.dtype for _, t in fl}
    if len(dtypes) < 2:
        return []
    mod, root = session.current()
    maps = session.maps_for(root)
    if maps is None:
        return []
    mpath = maps.modules.get(id(mod)) if mod is not None else None
    want = maps.dtype_for(mpath)
    wide = wider(dtypes)
    if want is None or want not in dtypes or wide == want:
        return []
    off = {p.path for p in maps.policy_problems() if p.kind == "dtype"}
    bad = []
    for k, t in fl:
        hit = maps.tensor_path(t) if t.dtype == wide else None
        if hit is not None and hit[0] in off:
            bad.append(k)
        elif made and hit is None and t.dtype == wide and _default_factory(t):
            bad.append(k)
    if not bad or _cast_back():
        return []
    label = _rules.label(func, bad[0])
    msg = (f"{label} is {dtype_str(wide)} and promotes the model's {dtype_str(want)} to {dtype_str(wide)} silently "
           f"(no error, and the result and everything after it compute in {dtype_str(wide)})")
    problem = Problem("dtype", label, "argument", dtype_str(wide), dtype_str(want), msg, op=str(func),
                      tensors=tuple(f"{_rules.label(func, k)}: {_rules._compact(t)}" for k, t in fl))
    return [_rules.Finding(problem, "dtype", want, tuple(bad), tuple(k for k, _ in fl))]



def _user_frame() -> Any:
    f: Any = sys._getframe(2)
    skip = __file__.rsplit("_guard", 1)[0], torch.__file__.rsplit("__init__", 1)[0]
    while f is not None and f.f_code.co_filename.startswith(skip):
        f = f.f_back
    return f


def _cast_back() -> bool:
    """Does the running user statement put its result back in the compute dtype (``torch.stack([x1 * cos, ...])
    .type_as(x)``, or ``out = x * freqs`` then ``return out.type_as(x)``)? A float32 table multiplied in and cast
    back on purpose (Wan's and many rope implementations) promotes nothing the model keeps. Read once per line."""
    from torchdoctor._guard.maker import _parsed as parsed_code

    f = _user_frame()
    key = (f.f_code, f.f_lineno) if f is not None else None
    if key is None:
        return False
    if key not in _BACK:
        if len(_BACK) > 4096:
            _BACK.clear()
        parsed = parsed_code(f.f_code)
        _BACK[key] = parsed is not None and _backs(parsed[0], f.f_lineno - parsed[1])
    return _BACK[key]


def _backs(tree: ast.AST, line: int) -> bool:
    simple = [n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return,
                                                           ast.Expr)) and n.lineno <= line <= (n.end_lineno or n.lineno)]
    if not simple:
        return False
    stmt = min(simple, key=lambda n: (n.end_lineno or n.lineno) - n.lineno)
    if _CAST_BACK.search(ast.unparse(stmt)):
        return True
    names = [t.id for t in getattr(stmt, "targets", [getattr(stmt, "target", None)]) if isinstance(t, ast.Name)]
    later = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.Return, ast.Expr))
             and n.lineno > (stmt.end_lineno or stmt.lineno)]
    return any(re.search(rf"(?<![\w.]){re.escape(n)}\.(type_as\(|to\([^()]*dtype|half\(|bfloat16\()", text)
               for n in names for text in later)
