"""A program checked in a dtype on this CPU (``cpudtype``) that asks for an accelerator this machine lacks
(``device="cuda"``: "Torch not compiled with CUDA enabled"): a device problem at the program's line, never a
traceback out of ``simulate``."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["asks_accelerator"]


def asks_accelerator(exc: BaseException, mode: Any) -> bool:
    """The program asked this CPU-only machine for an accelerator (``device="cuda"``: "Torch not compiled with CUDA
    enabled"): recorded as a device problem at the program's line, with its factory when the line makes the tensor
    there (fixed at it: ``device=`` the input's), never a traceback out of ``simulate``."""
    import linecache
    import re

    from torchdoctor._report.model import Problem
    from torchdoctor._virtual.escaped import raised_at
    from torchdoctor._virtual.origin import IN_SCOPE, LINES, short_at

    first = (str(exc).strip().splitlines() or [""])[0]
    if not re.search(r"not compiled with (CUDA|XPU|MPS)|no (CUDA|XPU) GPUs|Found no NVIDIA driver", first, re.I):
        return False
    frame, line = raised_at(exc)
    if frame is None:
        return False
    at = short_at(frame).rsplit(":", 1)[0] + f":{line}"
    code = frame.f_code
    LINES[at] = (code.co_filename, line)
    IN_SCOPE.setdefault(at, next((n for n in code.co_varnames[:code.co_argcount]
                                  if isinstance(frame.f_locals.get(n), torch.Tensor)), ""))
    asked = (re.search(r"compiled with (\w+)", first) or re.search(r"no (\w+)", first))
    found = (asked.group(1) if asked else "cuda").lower()
    p = Problem("device", "<top level>", "activation", found, "cpu",
                f"the program asks for {found} at {at} while the run checks the cpu ({type(exc).__name__}: {first}): "
                "make it on the device of what it meets", op="forward")
    mode.problems.append(p)
    made = re.search(r"torch\.(\w+)\([^#]*device\s*=", linecache.getline(code.co_filename, line))
    if made:
        mode.sources[(p.kind, p.path, p.op or "", p.found)] = (f"factory torch.{made.group(1)} at {at}",)
    return True
