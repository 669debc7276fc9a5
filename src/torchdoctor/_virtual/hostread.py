"""``.numpy()`` of a device tensor at the program's line, fixed there and proven on a copy: what the line read (its
dtype, and whether it required grad with grad on) is kept when the read is recorded; after the run the fix's calls
(``.cpu()``, and ``.detach()`` or ``.float()`` where the copy needs them: numpy refuses a tensor that requires grad,
and has no bfloat16 or float8) run on a CPU tensor of that dtype and state, then ``.numpy()``. The fix printed is the
one that ran; the program's own tensor is never touched."""

from __future__ import annotations

from typing import Any

import torch

READS: dict[str, tuple[torch.dtype, bool]] = {}  # "app.py:5" -> what was read there: dtype, required grad (grad on)
_LIMIT = 4096


def note_read(t: torch.Tensor, at: str) -> None:
    """Keep what the program's line ``at`` read with ``.numpy()`` (the first read there)."""
    if at not in READS and len(READS) < _LIMIT:
        READS[at] = (t.dtype, bool(t.requires_grad and torch.is_grad_enabled()))


def host_fix(key: str, found: str, expected: str, target: Any) -> Any:
    """The fix of a problem whose source is ``read at file:line`` (a ``.numpy()`` / ``np.asarray`` of a device
    tensor: ``read_fix``, else the advice to ``.cpu()`` it there) or ``draws at file:line`` (a sampling op given a
    generator of another device type: a generator made on ``expected``)."""
    from torchdoctor._virtual.prove import Fix

    if key.startswith("sampler draws at "):
        return Fix(f"# {key[17:]}: the DataLoader's sampler draws on the cpu: give the DataLoader a generator made "
                   "on the cpu (torch.Generator(), seeded as before), or none", "note", target)
    if key.startswith("draws at "):
        return Fix(f"# {key[9:]}: pass a generator made on {expected} (torch.Generator(device={expected!r}), seeded "
                   "as before), or none", "note", target)
    return read_fix(key[8:], found) or Fix(f"# {key[8:]} reads a tensor on {found} into numpy: .cpu() it first there",
                                           "note")


def read_fix(at: str, found: str) -> Any:
    """The fix of a ``.numpy()`` of a tensor on ``found`` at ``at``: the line with the calls a copy of what it read
    needed, proven by running them and ``.numpy()`` on that copy; None when the line cannot be rewritten."""
    from torchdoctor._placement import dtype_str
    from torchdoctor._virtual.moveline import numpy_fix
    from torchdoctor._virtual.prove import Fix

    read = READS.get(at)
    calls, why = (["cpu"], None) if read is None else _calls(*read)
    line = numpy_fix(at, found, "".join(f".{c}()" for c in calls))
    if line is None:
        return None
    also = [x for c, x in (("detach", "numpy refuses a tensor that requires grad"),
                           ("float", f"numpy has no {dtype_str(read[0]) if read else ''}")) if c in calls]
    line = (f"{line[0]} ({'; '.join(also)})" if also else line[0], line[1])
    if read is None:
        return Fix(line[0], "note", torch.device("cpu"), diff=line[1],
                   tried="not re-run: what the line read is not on record")
    state = f"{dtype_str(read[0])}{', requiring grad' if read[1] else ''}"
    if why is not None:
        return Fix(line[0], "note", torch.device("cpu"), diff=line[1],
                   tried=f"on a cpu copy of what {at} read ({state}): still raised {why}")
    return Fix(line[0], "note", torch.device("cpu"), diff=line[1], proven=True, at_op=True,
               sets=((f"read at {at}", torch.device("cpu")),),
               tried=f"on a cpu copy of what {at} read ({state}): {''.join(f'.{c}()' for c in calls)}.numpy() "
                     "gives the array")


def _calls(dtype: torch.dtype, grad: bool) -> tuple[list[str], str | None]:
    """The calls before ``.numpy()`` that a copy of a ``dtype`` tensor (requiring grad: ``grad``) needs, and what a
    copy still raised with them (None: it ran)."""
    calls = ["cpu"]
    for _ in range(3):
        err = _runs(dtype, grad, calls)
        if err is None:
            return calls, None
        if "requires grad" in err and "detach" not in calls:
            calls.insert(0, "detach")
        elif "ScalarType" in err and "float" not in calls and dtype.is_floating_point:
            calls.append("float")
        else:
            return calls, err
    return calls, _runs(dtype, grad, calls)


def _runs(dtype: torch.dtype, grad: bool, calls: list[str]) -> str | None:
    """None when a cpu tensor of ``dtype`` (requiring grad: ``grad``) gives an array through ``calls`` and
    ``.numpy()``, else what it raised. Outside every mode the run set (a default device, the virtual world)."""
    with torch._C.DisableTorchFunction(), torch.enable_grad():
        try:
            t = torch.zeros(2, dtype=dtype, device="cpu")
            if grad and (dtype.is_floating_point or dtype.is_complex):
                t.requires_grad_(True)
            for name in calls:
                t = getattr(t, name)()
            t.numpy()
        except (RuntimeError, TypeError) as exc:
            return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
    return None
