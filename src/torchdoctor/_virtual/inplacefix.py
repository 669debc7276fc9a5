"""An in-place op (``ema[n].lerp_(p.detach(), 0.01)``) whose self is on another device (or in another dtype: a
float32 EMA of a bfloat16 model) than its other operands: the op writes into self where it is, so its other operands
are moved (cast) to self's device (dtype) at the op's line. A move of self
there would update a copy the program never reads again, and a move where the program placed self (a cpu EMA kept on
purpose) undoes its choice; both are never written."""

from __future__ import annotations

import ast
import linecache
import re
from collections.abc import Sequence
from typing import Any

import torch

from torchdoctor._report.model import Problem
from torchdoctor._virtual.prove import Fix

_INPLACE = re.compile(r"^aten\.(\w+_)(?:\.\w+)?$")  # aten.lerp_.Scalar, aten.add_.Tensor (never aten.__ior__)


def inplace_fix(p: Problem, cases: Sequence[Any]) -> Fix | None:
    """The fix of ``p`` (a device problem at an in-place op, said of its self on ``p.found`` or of what it reads,
    self then on ``p.expected``) at the op's line: the other tensor arguments moved to ``<self>.device``, a diff;
    ``sets`` name those operands for the proof at the op. None when the op is not in place, self is on neither
    device, or the line cannot be rewritten."""
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._report.diff import line_patch

    m = _INPLACE.match(str(p.op or ""))
    if p.kind not in ("device", "dtype") or m is None or m.group(1).startswith("_") and \
            not m.group(1).startswith("_foreach_"):
        return None
    attr = p.kind

    def of(o: Any) -> str:
        return str(o.device) if attr == "device" else str(o.meta.dtype).removeprefix("torch.")

    def each(v: Any) -> list[Any]:  # an operand, or a foreach op's list of them
        return [x for x in (v if isinstance(v, (list, tuple)) else (v,)) if _operand(x)]

    # self on ``p.found`` (a problem said of self) or on ``p.expected`` (said of what it reads: the run kept self)
    case = next((c for c in cases if c.op == p.op and c.line is not None and c.before[0] and
                 each(c.before[0][0]) and of(each(c.before[0][0])[0]) in (p.found, p.expected)), None)
    if case is None or not own_file(case.line[0]):
        return None
    home = of(each(case.before[0][0])[0])

    def off_home(o: Any) -> bool:  # (a dtype: an index tensor, ``tok`` of ``index_add_``, is never cast)
        return of(o) != home and (attr == "device" or o.meta.is_floating_point())

    others = [o for c in cases if c.op == p.op and c.line == case.line  # each call of that line (a loop's)
              for v in (*c.before[0][1:], *c.before[1].values()) for o in each(v)
              if off_home(o) and _named(o) and (attr == "device" or o.meta.dim() > 0)]
    tags = [t for o in others for t in o.tags]  # a dtype: only a model's tensor read as it is (a bf16 model into a
    if not others or attr == "dtype" and (any(t.startswith("cast at ") for t in tags) or all(" " in t for t in tags)):
        return None  # float32 EMA); a cast that made what it reads is fixed at that cast
    file, line = case.line
    old = linecache.getline(file, line)
    off = {i for i, v in enumerate(case.before[0][1:]) if any(off_home(o) for o in each(v))} | {
        k for k, v in case.before[1].items() if any(off_home(o) for o in each(v))}
    new = _moved_args(old.rstrip("\r\n"), m.group(1), off, attr)
    if new is None:
        return None
    to: Any = torch.device(home) if attr == "device" else getattr(torch, home)
    verb, where = ("move", f"on {home}") if attr == "device" else ("cast", f"in {home}")
    return Fix(f"{new.strip()}  # {case.at}: {m.group(1)} writes into its self {where}, where the program keeps "
               f"it: {verb} what it reads to self's {attr} there (never self: the op would update a copy)", "note",
               to, sets=tuple(dict.fromkeys((_line_name(o), to) for o in others)), diff=line_patch(file, line, new))


def _line_name(o: Any) -> str:
    """The line's own name for operand ``o`` (``operand y at app.py:21``: what the fix casts there, near whatever
    made it), else its first other name."""
    return next((t for t in o.tags if t.startswith("operand ")), None) or _named(o)[0]


def _named(o: Any) -> list[str]:
    """What names operand ``o`` beyond the failing line's own name for it (``operand p at app.py:9``): its path,
    maker or the line that moved it. An operand only the line names is none the program placed (a model's parameter
    met by a copy made before the model's move): the in-place self is the one left behind, fixed where it is held."""
    return [t for t in o.tags if not t.startswith("operand ")]


def _operand(o: Any) -> bool:
    """``o`` is a failing op's operand twin (``atop.Operand``: its device and the names a fix calls it by)."""
    return hasattr(o, "tags") and hasattr(o, "device") and hasattr(o, "meta")


def _moved_args(text: str, name: str, off: set[Any], attr: str = "device") -> str | None:
    """``text`` with each argument of its ``<self>.<name>(...)`` call that the op received as a tensor on another
    device or in another dtype (``off``: positions after self, keyword names) written ``arg.to(<self>.<attr>)`` --
    never a number the
    line computes (``1. - self.decay`` is a float: it has no ``.to``) -- or None when the line holds no such call
    (or cannot be parsed alone)."""
    body = text.lstrip()
    indent = text[:len(text) - len(body)]
    try:
        tree = ast.parse(body)
    except SyntaxError:
        return None
    call = next((n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and
                 n.func.attr == name), None)
    if call is None or not isinstance(call.func, ast.Attribute):
        return None
    lists = name.startswith("_foreach_")  # ``torch._foreach_lerp_(ema, model, weight=w)``: self is its first list
    if lists and not call.args:
        return None
    head = call.args[0] if lists else call.func.value
    self_src = ast.get_source_segment(body, head)
    pos = call.args[1:] if lists else call.args
    args = [a for i, a in enumerate(pos) if i in off and not isinstance(a, ast.Constant)] + [
        k.value for k in call.keywords if k.arg in off and not isinstance(k.value, ast.Constant)]
    if self_src is None or not args or any(isinstance(n, ast.Call) for n in ast.walk(head)):
        return None
    out = body
    for a in sorted(args, key=lambda a: a.col_offset, reverse=True):  # from the right: offsets stay valid
        seg = ast.get_source_segment(body, a)
        if seg is None or a.end_col_offset is None or a.lineno != 1 or a.end_lineno != 1:
            return None
        wrapped = seg if isinstance(a, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)) else f"({seg})"
        moved = f"[t.to({self_src}[0].{attr}) for t in {seg}]" if lists else f"{wrapped}.to({self_src}.{attr})"
        out = out[:a.col_offset] + moved + out[a.end_col_offset:]
    return indent + out
