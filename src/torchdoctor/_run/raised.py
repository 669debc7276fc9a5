"""A program that raised is never reported as clean: what ``torchdoctor run`` says of an error that is not a
placement error it recognised.

The run's verdict read only placement findings and recorded problems, so a program that died of anything else —
diffusers' ``enable_model_cpu_offload`` on a machine with no accelerator, a crash of the virtual devices themselves
inside an exporter — was summed up as "no placement error" after a traceback, a false all-clear. Here the error is
said with the program's line, and which side it is on: the program's own, or the virtual devices' limit (a run that
could not check the program past that line).
"""

from __future__ import annotations

import traceback
from typing import Any

# texts of a virtual tensor met where real values or a real device are needed (its storage is meta or a label)
_LIMIT_TEXTS = ("data is not allocated yet", "Cannot copy out of meta tensor", "on meta tensors",
                "VirtualTensor", "Creating a new Tensor subclass", "basic_string: construction from null")


class Raised:
    """The error that ended the program: ``kind`` (its class), ``message`` (first line), ``at`` (the program's
    line), ``limit`` (the virtual devices could not carry the program there). An error ``explain`` recognises is a
    finding of the watcher's already, said with its diagnosis."""

    def __init__(self, exc: BaseException, root: str, virtual: bool) -> None:
        self.kind = type(exc).__name__
        self.message = (str(exc).strip().splitlines() or [""])[0][:300]
        frames = [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(exc.__traceback__)]
        from torchdoctor._run.watch import first_own_frame

        self.at = first_own_frame(frames, root)
        self.limit = virtual and _virtual_limit(exc)

    def lines(self, device: str | None) -> list[str]:
        at = f" at {self.at}" if self.at else ""
        said = f"{self.kind}: {self.message}" if self.message else self.kind
        if self.limit:
            past = self.at or "its error"
            return [f"could not check: the virtual {device} run could not carry the program past {past} "
                    f"({said}); torchdoctor's own limit, not the program's error: run it on the machine, or check "
                    f"the part before that line"]
        return [f"the program raised {said}{at}: not a placement error torchdoctor recognised"]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "at": self.at, "virtual_limit": self.limit}


def _virtual_limit(exc: BaseException) -> bool:
    """The virtual devices' own failure, not the program's: a text of a virtual tensor met where values are needed
    (anywhere in the chain). An error the virtual devices raise as the machine would (a device type the build lacks)
    is the program's."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if any(s in str(cur) for s in _LIMIT_TEXTS):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def keep(watcher: Any, exc: BaseException) -> None:
    """The error that ended the program, for the report (the first one: a re-raise keeps it)."""
    if getattr(watcher, "raised_exc", None) is None:
        watcher.raised_exc = exc


def raised(watcher: Any, virtual: bool) -> Raised | None:
    exc = getattr(watcher, "raised_exc", None)
    if exc is None:
        return None
    try:
        return Raised(exc, watcher.root, virtual)
    except Exception:
        return None
