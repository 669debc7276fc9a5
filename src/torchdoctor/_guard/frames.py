"""The user's frames a maker is read from: the frames of a traceback or of the running stack outside torch and
torchdoctor (``user_frames``), each with the frame it called (``Frames.callee``: a running statement made a tensor
only if its call received it), and each frame's line as the traceback gives it (``lineno``)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Frames", "holds", "lineno", "same", "user_frames"]


def same(v: torch.Tensor, t: torch.Tensor) -> bool:
    if v is t or t._base is v or (v._base is not None and v._base is t._base):
        return True
    try:
        return v.dtype == t.dtype and v.device == t.device and v.device.type != "meta" and \
            v.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    except Exception:  # odd subclasses have no storage to compare
        return False


# a frame's line as its traceback entry gives it: a frame the error left has moved on (to a ``with`` exit)
_TB_LINES: dict[int, tuple[Any, int]] = {}


def lineno(frame: Any) -> int:
    kept = _TB_LINES.get(id(frame))
    return kept[1] if kept is not None and kept[0] is frame.f_code else frame.f_lineno


def user_frames(tb: Any = None, limit: int = 12) -> list[Any]:
    """The frames of the user's code (not torch's, not torchdoctor's) on a traceback, or on the current stack,
    outermost first."""
    import os
    import sys

    skip = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))
    out: list[Any] = []
    if tb is not None:
        _TB_LINES.clear()
        while tb is not None:
            out.append(tb.tb_frame)
            _TB_LINES[id(tb.tb_frame)] = (tb.tb_frame.f_code, tb.tb_lineno)  # never the frame: it holds tensors
            tb = tb.tb_next
    else:
        f: Any = sys._getframe(1)
        while f is not None and len(out) < 200:
            out.append(f)
            f = f.f_back
        out.reverse()
    kept = Frames(f for f in out if not f.f_code.co_filename.startswith(skip))
    kept.callee = {id(a): b for a, b in zip(out, out[1:]) if not a.f_code.co_filename.startswith(skip)}
    return kept[-limit:] if len(kept) > limit else kept


class Frames(list):  # type: ignore[type-arg]
    """The user's frames, outermost first, with the frame each one called (``callee``, by id): a frame's running
    statement made a tensor only if the call it is in received it."""

    callee: dict[int, Any] = {}

    def __getitem__(self, i: Any) -> Any:
        got = super().__getitem__(i)
        if isinstance(i, slice):
            got = Frames(got)
            got.callee = self.callee
        return got


def holds(frame: Any, t: torch.Tensor) -> bool:
    """Does ``frame`` hold ``t`` as a local, or one container level inside one (``*args``, ``**kwargs``)?"""
    for v in frame.f_locals.values():
        for x in (v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else (v,)):
            if isinstance(x, torch.Tensor) and same(x, t):
                return True
    return False
