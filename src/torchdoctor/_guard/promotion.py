"""strict: a silent dtype promotion is a problem. An op that mixes floating dtypes runs without error when the
result may promote (``bf16 * fp32 -> fp32``), and the model's compute dtype is lost from there on with no error
to explain. strict reports it when the wider operand is one of the model's own tensors that the policy already
finds off-policy (an fp32 plain attribute in a bf16 model), by path, with the fix that casts it.

Narrowed on purpose: a forward's own upcast (T5's norm computes its variance in float32 from a ``.to(float32)``
copy) mixes dtypes the same way and is intended, so a tensor made in forward is never blamed here, and neither is a
tensor the policy keeps in float32 (``_keep_in_fp32_modules``). Only ops the rules found nothing wrong with reach
this check, and only when their operands mix floating dtypes: the happy path never gets here.

The report is built where the promotion happens (its module, its operands, its frames) but raised only when the
guarded block ends without another error: a promotion that a later op refuses (``lin(x * scale)`` failing in
``addmm``) is explained by that op's report, as before; one that never fails is raised at the block's end.

>>> import torch
>>> wider([torch.bfloat16, torch.float32]), wider([torch.float16, torch.float16])
(torch.float32, torch.float16)
"""

from __future__ import annotations

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


def findings(session: Session, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[_rules.Finding]:
    """The promotion finding of this op, or none."""
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
    if not bad:
        return []
    label = _rules.label(func, bad[0])
    msg = (f"{label} is {dtype_str(wide)} and promotes the model's {dtype_str(want)} to {dtype_str(wide)} silently "
           f"(no error, and the result and everything after it compute in {dtype_str(wide)})")
    problem = Problem("dtype", label, "argument", dtype_str(wide), dtype_str(want), msg, op=str(func),
                      tensors=tuple(f"{_rules.label(func, k)}: {_rules._compact(t)}" for k, t in fl))
    return [_rules.Finding(problem, "dtype", want, tuple(bad), tuple(k for k, _ in fl))]


def note(session: Session, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Build the report of a silent promotion once per block and keep it on the session (``pending``)."""
    if getattr(session, "pending", None) is not None:
        return
    found = findings(session, func, args, kwargs)
    if not found:
        return
    g = session.g
    with g._lock:  # the report's problems are recorded only if it is raised (guard.__exit__)
        kept, seen = list(g.problems), set(g._seen)
    try:
        session.on_problem(func, args, kwargs, found)
    except Exception as err:  # strict raises its report: keep it
        session.pending = err
    finally:
        with g._lock:
            g.problems[:], g._seen = kept, seen
