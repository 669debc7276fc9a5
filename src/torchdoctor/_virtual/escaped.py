"""Placement errors torch raises in Python before any op is dispatched (``nn.LSTM``/``GRU``/``RNN`` compare their
input's dtype with their weights' in ``check_input``): a virtual run records them as a problem at the module whose
code raised instead of letting a traceback end it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
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
    if (numpy := _to_numpy(exc, first, paths)) is not None:
        return numpy
    from torchdoctor._virtual.intrefused import refused_operand  # an integer operand a kernel refuses everywhere

    if (refused := refused_operand(exc, first, paths, raised_at(exc)[0])) is not None:
        return refused
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


_NUMPY_CALL = r"(?<![\w.])([A-Za-z_]\w*)((?:\.(?:cpu|detach|contiguous|squeeze|clone)\(\))*)\.numpy\(\)"  # compiled on use


def _to_numpy(exc: BaseException, first: str, paths: Mapping[int, str]) -> tuple[Problem, str, tuple[str, ...]] | None:
    """``images.cpu().numpy()`` of a bfloat16 tensor (numpy has no bfloat16: "TypeError: Got unsupported ScalarType
    BFloat16"): the line that called it, the tensor by the name the line gives it, and the fix at that line (the
    tensor cast to float32 first, its source ``operand images at app.py:11``)."""
    import linecache

    from torchdoctor._placement import compact, dtype_str, tensor_device
    from torchdoctor._virtual.origin import LINES, short_at

    if not isinstance(exc, TypeError) or "unsupported ScalarType" not in first or exc.__traceback__ is None:
        return None
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    f = _user(tb.tb_frame)
    if f is None:
        return None
    line = linecache.getline(f.f_code.co_filename, f.f_lineno)
    for name, _ in re.findall(_NUMPY_CALL, line):
        t = f.f_locals.get(name)
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype not in (torch.float16, torch.float32,
                                                                                     torch.float64):
            at = short_at(f)
            LINES[at] = (f.f_code.co_filename, f.f_lineno)
            shown = compact(t.dtype, tuple(t.shape), tensor_device(t))
            module = f.f_locals.get("self")
            mpath = paths.get(id(module)) if isinstance(module, nn.Module) else None
            mtype = type(module).__name__ if mpath is not None else None
            message = (f"{name} {shown} .numpy() at {at}: numpy has no {dtype_str(t.dtype)} ({type(exc).__name__}: "
                       f"{first}); cast it first: {name}.float().cpu().numpy()")
            problem = Problem("dtype", mpath or ("<root>" if mtype else "<top level>"), "activation",
                              dtype_str(t.dtype), "float32", message, op="Tensor.numpy", module_path=mpath,
                              module_type=mtype)
            return problem, f"the run ended at .numpy() of a {dtype_str(t.dtype)} tensor at {at}", (
                f"operand {name} at {at}",)
    return None


def _user(frame: Any) -> Any:
    """The innermost frame outside torch and torchdoctor, from ``frame`` outwards."""
    from torchdoctor._virtual.origin import MACHINERY

    while frame is not None and frame.f_code.co_filename.startswith(MACHINERY):
        frame = frame.f_back
    return frame


def raised_at(exc: BaseException) -> tuple[Any, int]:
    """(frame, line) of the innermost of the program's own frames ``exc`` passed (its line as it raised there), not
    torch's or torchdoctor's; (None, 0) when it passed none."""
    from torchdoctor._virtual.origin import MACHINERY

    tb: Any = exc.__traceback__
    frame, line = None, 0
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(MACHINERY):
            frame, line = tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next
    return frame, line
