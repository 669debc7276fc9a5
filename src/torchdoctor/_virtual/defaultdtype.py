"""A factory given no dtype while the program has set another default dtype around part of its work
(``torch.set_default_dtype(torch.bfloat16)`` around the forward only, as a "bf16-true" precision plugin does): the
tensor's dtype is whatever the default is when the call runs. Activation checkpointing runs the forward again in the
backward, outside that setting, so the same line makes a float32 tensor there and torch raises ``CheckpointError``
("Recomputed values for the following tensors have different metadata").

A run notes such a call (``note``: its line, the dtype it made, a tensor of the function already in that dtype, the
forward's argument first) and every later call at that line (the recompute: what it made, and what that tensor was
then); ``aim`` (asked by the run's report) turns a ``CheckpointError`` the run met into that line's fix,
``dtype=x.dtype`` given to the factory, a diff. The fix is checked on those records: at each call the named tensor
had the dtype the forward saved, so the line makes that dtype in the forward and in the recompute alike.
"""

from __future__ import annotations

import re
from typing import Any

import torch

_LIMIT = 256  # lines kept per run
# "file:line" -> [file, line, factory, dtype made under the set default, the name of a tensor of that dtype in scope,
# the calls made at the line since: (default dtype then, dtype made, the named tensor's dtype then or None)]
MADE: dict[str, list[Any]] = {}
_SAVED = re.compile(r"saved metadata: \{[^}]*'dtype': torch\.(\w+)")
_AGAIN = re.compile(r"recomputed metadata: \{[^}]*'dtype': torch\.(\w+)")


def note(out: Any, func: Any, kwargs: dict[str, Any]) -> Any:
    """``out``, made by the factory ``func`` at the program's line with no ``dtype=``: noted while the default dtype
    is not float32 (and, at a line noted so, always). Returns ``out``."""
    if kwargs.get("dtype") is not None or not isinstance(out, torch.Tensor) or not out.is_floating_point():
        return out
    default = torch.get_default_dtype()
    if default is torch.float32 and not MADE:
        return out
    from torchdoctor._virtual.moveby import is_own
    from torchdoctor._virtual.origin import LINES, short_at, user_frame

    f = user_frame(2)
    if f is None or not is_own(f.f_code.co_filename):
        return out
    at = short_at(f)
    seen = MADE.get(at)
    if seen is not None:
        if len(seen[5]) < 8:
            named = f.f_locals.get(seen[4]) if seen[4] else None
            seen[5].append((default, out.dtype, named.dtype if isinstance(named, torch.Tensor) else None))
        return out
    if default is torch.float32 or out.dtype != default or len(MADE) >= _LIMIT:
        return out
    MADE[at] = [f.f_code.co_filename, f.f_lineno, f"torch.{getattr(func, '__name__', 'tensor')}", out.dtype,
                _named(f, out), [(default, out.dtype, out.dtype)]]
    LINES.setdefault(at, (f.f_code.co_filename, f.f_lineno))
    return out


def _named(f: Any, out: torch.Tensor) -> str | None:
    """A tensor of ``out``'s dtype the function holds (its arguments first, ``self`` never): what a fix reads the
    dtype from (``dtype=x.dtype``)."""
    code = f.f_code
    names = [*code.co_varnames[:code.co_argcount], *f.f_locals]
    return next((n for n in dict.fromkeys(names) if n != "self" and (v := f.f_locals.get(n)) is not out and
                 isinstance(v, torch.Tensor) and v.is_floating_point() and v.dtype == out.dtype), None)


def clear() -> None:
    MADE.clear()


def aim(finding: Any, text: str = "") -> None:
    """The run's ``CheckpointError`` (``finding``), aimed at the line whose factory made a checkpointed tensor with
    the default dtype: its culprit, fix and diff set when such a line was noted, whose calls made two dtypes (the
    dtypes ``text``, the error's whole message, names as saved and recomputed, where it holds them)."""
    saved, again = _SAVED.search(text), _AGAIN.search(text)
    if not MADE or "Recomputed values" not in finding.error:
        return
    hits = [(at, rec) for at, rec in MADE.items() if (saved is None or str(rec[3]).endswith("." + saved.group(1)))
            and any(made != rec[3] and (again is None or str(made).endswith("." + again.group(1)))
                    for _, made, _ in rec[5])]
    if not hits:
        return
    from torchdoctor._virtual.castfix import maker_diff

    at, (_, _, op, dtype, name, calls) = hits[0]
    short = str(dtype).rsplit(".", 1)[-1]
    other = next(str(made).rsplit(".", 1)[-1] for _, made, _ in calls if made != dtype)
    kept = name is not None and all(d == dtype for _, _, d in calls)  # the named tensor had it at every call
    diff = maker_diff(op, at, dtype, {"dtype": f"{name}.dtype"}) if kept else None
    finding.culprit = (f"culprit: {op} at {at} is given no dtype, so it makes its tensor in the default dtype: "
                       f"{short} in the forward (the program set it), {other} when the backward recomputed "
                       f"the checkpointed forward outside that setting" +
                       (f"; {len(hits) - 1} more such line(s): {', '.join(a for a, _ in hits[1:4])}"
                        if len(hits) > 1 else ""))
    if diff is not None:
        finding.fix = (f"{op}(..., dtype={name}.dtype)  # at {at}: the dtype of the tensor it is used with, not "
                       f"the default; checked on the run's calls: {name} was {short} in the forward and in the "
                       f"recompute")
        finding.fix_from, finding.diff = "run", diff
    else:
        finding.fix = (f"# give {op} at {at} the dtype it is used in (dtype= a tensor's .dtype there), or keep the "
                       f"default dtype set around the backward too; unproven: no tensor of its function had "
                       f"{short} at every call")
        finding.fix_from = "run"
