"""``model.load_state_dict(sd, assign=True)`` at the program's line, mid-run, with a state dict on the cpu: torch puts
the state dict's own tensors in place of the model's parameters and buffers, so a model that was on the device is
back on the cpu (and an optimizer built before holds the old parameters, which the forward no longer reads: training
would step tensors nothing uses). A move of the model after the load hides the crash, not the stale optimizer; the
fix is that line without ``assign=True``: torch then copies the values into the tensors the model has, on their
device, in their dtype. Only a load that replaced tensors held on a device (never meta: ``assign=True`` is how a
model built on meta gets its weights) is recorded, each tensor it put in by the line; the fix sets what the move
would, so it is proven at the failing ops the same way.
"""

from __future__ import annotations

import ast
import sys
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torchdoctor._virtual.prove import Fix

__all__ = ["assign_fixes", "install"]

# a tensor ``load_state_dict(..., assign=True)`` put in place of one held on a device -> (file, line, "app.py:21")
# (by id, with a weak reference that says the id is still that tensor's)
_PUT: dict[int, tuple[weakref.ref[torch.Tensor], tuple[str, int, str]]] = {}


def install(installs: Any) -> None:
    _PUT.clear()
    installs.set(torch.nn.Module, "load_state_dict", _wrapped(torch.nn.Module.load_state_dict))


def _wrapped(original: Any) -> Any:
    def load_state_dict(self: Any, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        if not assign or not isinstance(self, torch.nn.Module):
            return original(self, state_dict, strict, assign)
        before = _held(self)
        out = original(self, state_dict, strict, assign)
        at = _program_line()
        if at is not None:
            from torchdoctor._virtual.tensor import VirtualTensor

            for name, t in _held(self).items():
                old = before.get(name)
                if old is not None and old is not t and isinstance(old, VirtualTensor) and \
                        old._td_device.type != "meta" and not isinstance(t, VirtualTensor) and t.device.type == "cpu":
                    _PUT[id(t)] = (weakref.ref(t), at)
        return out

    load_state_dict.__name__ = load_state_dict.__qualname__ = "load_state_dict"
    load_state_dict.__doc__ = original.__doc__
    return load_state_dict


def _held(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for prefix, mod in m.named_modules(remove_duplicate=False):
        for name, t in (*mod._parameters.items(), *mod._buffers.items()):
            if t is not None:
                out[f"{prefix}.{name}" if prefix else name] = t
    return out


def _program_line() -> tuple[str, int, str] | None:
    """The program's own line that called the load (past torchdoctor's and torch's frames), or None."""
    from torchdoctor._virtual.moveby import is_own
    from torchdoctor._virtual.origin import MACHINERY, short_at

    f: Any = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(MACHINERY):
        f = f.f_back
    if f is None or not is_own(f.f_code.co_filename):
        return None
    return f.f_code.co_filename, f.f_lineno, short_at(f)


def assign_fixes(items: Sequence[Fix], root: Any) -> list[Fix]:
    """A whole move of the model's tensors (``torchdoctor.move(model, 'cuda:0')``) that a load with ``assign=True``
    put on the cpu, each by one line of the program: that line without ``assign=True`` (module doc)."""
    if not _PUT or not isinstance(root, torch.nn.Module):
        return list(items)
    return [_dropped(f, root) or f for f in items]


def _dropped(f: Fix, root: torch.nn.Module) -> Fix | None:
    if f.kind != "path" or not f.sets or not f.code.startswith("torchdoctor.move("):
        return None
    held = _held(root)
    lines = {_put(held.get(p)) for p, _ in f.sets}
    if len(lines) != 1 or None in lines:
        return None
    file, line, at = next(iter(lines))  # type: ignore[misc]
    got = _without_assign(file, line)
    if got is None:
        return None
    new, shown = got
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.prove import Fix

    diff = line_patch(file, line, new)
    if diff is None:
        return None
    return Fix(f"{shown}  # assign=True at {at} put the state dict's cpu tensors in place of the model's "
               "(an optimizer built before holds the old ones): load into the tensors it has, on their device",
               "note", f.target, sets=f.sets, diff=diff)


def _put(t: torch.Tensor | None) -> tuple[str, int, str] | None:
    hit = _PUT.get(id(t)) if t is not None else None
    return hit[1] if hit is not None and hit[0]() is t else None


def _without_assign(file: str, line: int) -> tuple[str, str] | None:
    """Line ``line`` of ``file`` with the ``assign=True`` keyword of its one ``load_state_dict`` call taken out, and
    its statement alone (no comment) for the report; None when the line is not one such call on one line."""
    from torchdoctor._virtual.ownline import own_line

    read = own_line(file, line)
    if read is None or not read[1].isascii():
        return None
    raw, body, tree = read
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "load_state_dict"]
    if len(calls) != 1:
        return None
    call = calls[0]
    kw = next((k for k in call.keywords if k.arg == "assign"), None)
    if kw is None or not (isinstance(kw.value, ast.Constant) and kw.value.value is True) or kw.end_col_offset is None:
        return None
    ends = [a.end_col_offset for a in call.args] + [k.value.end_col_offset for k in call.keywords
                                                    if k is not kw and k.col_offset < kw.col_offset]
    pad = len(raw) - len(body)
    if ends:  # from the end of the argument before it: ``sd, assign=True`` -> ``sd``
        start, end = max(e or 0 for e in ends), kw.end_col_offset
    else:  # the first argument: ``(assign=True, sd)`` -> ``(sd)``
        start, end = kw.col_offset, kw.end_col_offset
        rest = body[end:]
        end += len(rest) - len(rest.lstrip(", "))
    stmt = tree.body[0]
    if start is None or len(tree.body) != 1 or stmt.end_col_offset is None:
        return None
    return raw[:pad + start] + raw[pad + end:], (body[:start] + body[end:stmt.end_col_offset]).strip()
