"""A device written into a forward (``torch.zeros(..., device="cuda")``, ``.to("cuda")``) on a machine that has none
of it (a Mac, a CPU-only box: ``Torch not compiled with CUDA enabled``): the line is the maker, and the fix is the
device of the forward's own input there (``device=x.device``), proven by running the module again with that call
given the input's device (a function mode at that line; nothing is edited), offered as a diff of the user's file."""

from __future__ import annotations

import linecache
import os
import re
import sys
from typing import Any

import torch

_LITERAL = re.compile(r"""device\s*=\s*(['"])(cuda|xpu|mps)(:\d+)?\1|\.to\(\s*(['"])(cuda|xpu|mps)(:\d+)?\4\s*\)""")


def _input_name(frame: Any) -> str | None:
    code = frame.f_code
    for n in code.co_varnames[1:code.co_argcount]:
        if isinstance(frame.f_locals.get(n), torch.Tensor):
            return n
    return None


def hardcoded_report(session: Any, exc: BaseException, frame: Any, mod: Any, mpath: str | None) -> Any:
    """The report of a forward's line that asks for a device this machine lacks, or None."""
    from torchdoctor._guard.remedy import own_file, rerun, with_patch
    from torchdoctor._report.diff import line_patch
    from torchdoctor._report.model import PlacementError, Problem
    from torchdoctor._report.text import format_error

    path, lineno = frame.f_code.co_filename, frame.f_lineno
    raw = linecache.getline(path, lineno).rstrip("\r\n")
    hit = _LITERAL.search(raw)
    arg = _input_name(frame)
    if hit is None or arg is None:
        return None
    asked = (hit.group(2) or hit.group(5)) + (hit.group(3) or hit.group(6) or "")
    dev = frame.f_locals[arg].device
    new = raw[:hit.start()] + (f"device={arg}.device" if hit.group(2) else f".to({arg}.device)") + raw[hit.end():]
    at = f"{os.path.basename(path)}:{lineno}"
    from torch.overrides import TorchFunctionMode

    hits = [0]

    class AtLine(TorchFunctionMode):  # the call at the line given the input's device, as the fixed line would
        def __torch_function__(self, func: Any, types: Any, a: Any = (), kw: Any = None) -> Any:
            kw = dict(kw or {})
            f = sys._getframe(1)
            if f.f_code.co_filename == path and f.f_lineno == lineno:
                if "device" in kw and str(kw["device"]).split(":")[0] == asked.split(":")[0]:
                    kw["device"], hits[0] = dev, hits[0] + 1
                elif getattr(func, "__name__", "") == "to" and len(a) > 1 and str(a[1]).startswith(asked):
                    a, hits[0] = (a[0], dev, *a[2:]), hits[0] + 1
            return func(*a, **kw)

    inputs = tuple(session.frames.inputs_of(mod))
    proof = rerun(mod, inputs, session.frames, f"{asked!r} -> {arg}.device ({dev}) at {at}", AtLine()) \
        if inputs else "fix unproven: not re-run (the module's inputs are not known)"
    if proof.startswith("fix proven") and not hits[0]:
        proof = f"fix unproven: the re-run of {type(mod).__name__} never reached {at}"
    where = f"`{mpath or '<root>'}` ({type(mod).__name__})"
    head = f"device problem in {where}: {at} asks for {asked}, which this machine has none of; the module runs on {dev}"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lines = [f"culprit: the device written at {path}:{lineno} (`{raw.strip()}`): {hit.group(0)}",
             f"{arg} (the forward's input): on {dev}", proof, f"original error: {type(exc).__name__}: {first}"]
    fix = f"{new.strip()}  # {at}"
    problem = Problem("device", f"device written at {at}", "input", asked, str(dev),
                      f"{at} asks for {asked} in {where}, which this machine has none of; expected {dev}")
    err = PlacementError(format_error(head, lines, fix), module_path=mpath, module_type=type(mod).__name__, op=None,
                         problems=[problem], fix=fix)
    patch = line_patch(path, lineno, new) if own_file(path) and proof.startswith("fix proven") else None
    return with_patch(err, patch, lines)
