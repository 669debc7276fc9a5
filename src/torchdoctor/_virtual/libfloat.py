"""A dtype a device cannot compute in, met by an op an installed library's own code runs (torch's ``GradScaler.unscale_``
computes ``self._scale.double().reciprocal()`` on the device; peft's ``IncrementalPCA`` sums in float64 on the data's
device): the library's line is named beside the program's line that reached it, and the fix is what the program can
change -- the library's line is never edited, and nothing the program made or moved is in that dtype, so no cast of
the program's tensors reaches it.

The problem's message carries the library's line (``LIBRARY``), written when the op is recorded; the fix is read
from it, after the run.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

import torch

from torchdoctor._placement import device_str

LIBRARY = "; the library's own code runs it: "  # the mark a problem's message carries, then ``file:line in qual``
# torch's own frames between a library's line and the op (the tensor method, the function override machinery): never
# the line that computes
_PLUMBING = tuple(os.sep.join(("torch", x)) for x in ("_tensor.py", "overrides.py", "_ops.py", "functional.py",
                                                      os.path.join("utils", "_python_dispatch.py"),
                                                      os.path.join("utils", "_contextlib.py"), "_jit_internal.py",
                                                      os.path.join("nn", "functional.py"), "_compile.py"))
_MODES = ("__torch_function__", "__torch_dispatch__")  # a mode's or subclass's hop (torch.set_default_device's)
_TORCH = os.path.dirname(os.path.abspath(torch.__file__ or "")) + os.sep
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_LAYERS = os.path.join(_TORCH, "nn", "modules") + os.sep  # a torch layer computing what it is given: the model's


def library_line(depth: int = 2) -> str | None:
    """``LIBRARY`` and ``file:line in Class.method (`code`)`` of the innermost frame (from ``depth`` up) in an installed
    library's code, where the op running now was called; None when that frame is the program's own, a torch layer's
    forward (the model's dtype), or only torch's dispatch machinery is there. Asked only when an op fails."""
    from torchdoctor._guard.ownfile import own_file

    f: Any = sys._getframe(depth)
    while f is not None and (f.f_code.co_filename.startswith(_OURS) or f.f_code.co_filename.endswith(_PLUMBING) or
                             f.f_code.co_name in _MODES):
        f = f.f_back
    if f is None:
        return None
    name = f.f_code.co_filename
    if name.startswith(("<", _LAYERS)) or own_file(name):  # ``<string>``: the program's code run by exec
        return None
    code = linecache.getline(name, f.f_lineno).strip()
    qual = getattr(f.f_code, "co_qualname", f.f_code.co_name)
    from torchdoctor._virtual.origin import LINES, short_at

    g, at = f.f_back, None
    while g is not None and not (own_file(g.f_code.co_filename) and not g.f_code.co_filename.startswith(_OURS)):
        g = g.f_back
    if g is not None:  # the program's line that reached it (its file and line kept for the fix)
        at = short_at(g)
        LINES[at] = (g.f_code.co_filename, g.f_lineno)
    return f"{LIBRARY}{_short(name)}:{f.f_lineno} in {qual}" + (f" (`{code}`)" if code and len(code) < 160 else "") \
        + (f", reached from {at}" if at else "")


def _short(name: str) -> str:
    """``torch/amp/grad_scaler.py``: a library's file from its package folder on, as an import names it."""
    full = os.path.abspath(name)
    roots = sorted((os.path.abspath(p) for p in sys.path if p and "-packages" in p), key=len, reverse=True)
    root = next((r for r in roots if full.startswith(r + os.sep)), None)
    return full[len(root) + 1:] if root else os.sep.join(full.split(os.sep)[-3:])


_MARK = re.compile(re.escape(LIBRARY) + r"(\S+:\d+) in ([\w.<>]+)(?: \(`(.*?)`\))?(?:, reached from (\S+:\d+))?")


def library_of(message: str) -> tuple[str, str, str, str | None] | None:
    """(``file:line``, ``Class.method``, its code, the program's line that reached it) of the library line a
    problem's message names, else None."""
    m = _MARK.search(message)
    return (m.group(1), m.group(2), m.group(3) or "", m.group(4)) if m else None


def library_fixes(problems: Sequence[Any], device: torch.device) -> list[Any]:
    """One fix per program line and library: the first library line its problems name, and how many more."""
    groups: dict[tuple[str | None, str], list[tuple[Any, tuple[str, str, str, str | None]]]] = {}
    for p in problems:
        if (lib := library_of(p.message)) is not None:
            groups.setdefault((lib[3], _package(lib[0])), []).append((p, lib))
    out = []
    for items in groups.values():
        more = list(dict.fromkeys(lib[0] for _, lib in items[1:] if lib[0] != items[0][1][0]))
        out.append(library_fix(items[0][0], items[0][1], device, more))
    return out


def own_line(at: str) -> bool:
    """``file:line`` (as problems write it) is in the program's own file."""
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._virtual.origin import LINES

    file = LINES.get(at, ("", 0))[0]
    return bool(file) and own_file(file)


def _package(at: str) -> str:
    return at.split("/", 1)[0].split(os.sep, 1)[0]


def library_fix(p: Any, lib: tuple[str, str, str, str | None], device: torch.device, more: Sequence[str] = ()) -> Any:
    """The fix of ``p``, a dtype ``device`` cannot compute in met by a library's own op (its line ``lib``): what the
    program can change, said as advice (a re-run of the program changed so is not made here)."""
    from torchdoctor._virtual.prove import Fix

    at, qual, _code, where = lib
    package = _package(at)
    line = _program_line(where)
    reached = f", reached from your line {where}" + (f" (`{line}`)" if line else "") if where else ""
    which = f"cannot hold {p.found}" if "cannot hold" in p.message else \
        f"has no {p.found} kernels (it holds {p.found} but computes nothing in it)"
    also = f", and {len(more)} more of its line(s): {', '.join(more[:3])}{' …' if len(more) > 3 else ''}" if more else ""
    owner = f"{package}'" if package.endswith("s") else f"{package}'s"
    head = (f"# {at} ({qual}, {owner} own code{reached}{also}) computes in {p.found} on {device_str(device)}, which "
            f"{which}; your program makes and moves no {p.found} tensor there, so no cast of yours reaches it")
    if qual.startswith("GradScaler."):
        fix = (f"{head}. Train without a GradScaler under torch.autocast(device_type={device.type!r}, "
               "dtype=torch.bfloat16): bfloat16 keeps float32's exponent range, so it needs no loss scaling "
               "(scaler.scale(loss).backward() -> loss.backward(); scaler.step(optimizer) -> optimizer.step(); drop "
               "scaler.update()), or use a torch whose GradScaler keeps that math in float32 on "
               f"{device.type}")
        return Fix(fix, "note", noscale=device.type,  # a re-run (simulate's call=) trains so, and judges it
                   tried="not re-run: the change is to the program's training loop (no GradScaler, bfloat16 "
                         "autocast); simulate(model, call=...) re-runs it so")
    if "device=" in line:  # the call places what it makes: made on the cpu, then moved
        fix = (f"{head}. Make that call on the cpu (device=\"cpu\" at your line) and move what you then use to "
               f"{device.type}, or use a path of {package} that does not compute in {p.found} on {device.type}")
    else:
        fix = (f"{head}. Give that call its tensors on the cpu (x.cpu()) and move its result to {device.type} after, "
               f"or use a path of {package} that does not compute in {p.found} on {device.type}")
    return Fix(fix, "note", tried="not re-run: the computation is the library's, called from the program's line")


def _program_line(where: str | None) -> str:
    """The code of the program's line ``file:line`` (as problems write it), or ''."""
    from torchdoctor._virtual.origin import LINES

    file, line = LINES.get(where or "", ("", 0))
    return re.sub(r"\s+#[^'\"]*$", "", linecache.getline(file, line).strip()) if file else ""  # the code, no comment
