"""Placement errors torch raises in Python before any op is dispatched (``nn.LSTM``/``GRU``/``RNN`` compare their
input's dtype with their weights' in ``check_input``): a virtual run records them as a problem at the module whose
code raised instead of letting a traceback end it."""

from __future__ import annotations

import re
from collections.abc import Mapping

from torch import nn

from torchdoctor._report.model import Problem


def escaped_problem(exc: BaseException, paths: Mapping[int, str]) -> tuple[Problem, str, tuple[str, ...]] | None:
    """(the problem, why the run stopped, the named tensors its input came from) for a placement error, None for
    any other exception. ``paths``: module id -> path of the run's modules."""
    from torchdoctor._explain.tokens import devices_in, dtypes_in
    from torchdoctor._guard.diagnose import placement_category

    first = (str(exc).strip().splitlines() or [""])[0]
    if not first or placement_category(first) is None:
        return None
    kind = "device" if re.search(r"\bdevices?\b", first, re.IGNORECASE) else "dtype"
    names = [*(devices_in(first) if kind == "device" else dtypes_in(first)), "?", "?"]
    found, expected = (names[1], names[0]) if "got type" in first else (names[0], names[1])
    mpath, mtype, tb, sources = None, None, exc.__traceback__, ()
    while tb is not None:  # the innermost module whose code raised (the stack unwound with the exception)
        obj, code = tb.tb_frame.f_locals.get("self"), tb.tb_frame.f_code
        if isinstance(obj, nn.Module) and id(obj) in paths:
            mpath, mtype = paths[id(obj)], type(obj).__name__
            if code.co_name == "forward" and code.co_argcount > 1:  # its input 0: where it came from (data flow)
                origin = getattr(tb.tb_frame.f_locals.get(code.co_varnames[1]), "_td_origin", None)
                sources = origin.source.paths if origin is not None else ()
        tb = tb.tb_next
    text = f"{type(exc).__name__}: {first}"
    place = (mpath or "<root>") if mtype else "<top level>"
    message = f"input 0 is {found} where {place} ({mtype}) expects {expected}: {text}" if mtype else text
    return (Problem(kind, place, "activation", found, expected, message, op=f"{mtype}.forward" if mtype else "forward",
                    module_path=mpath, module_type=mtype),
            f"the run ended at a check torch makes before any op: {text}", tuple(sources))
