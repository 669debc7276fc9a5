"""A component the program keeps in its own dtype or on its own device on purpose, fed an input made for another
component: the input is the odd one, fixed where the program hands it to that component, never the component.

A diffusers VAE whose config sets ``force_upcast`` is cast to float32 by its pipeline (``self.vae.to(torch.float32)``)
while the denoiser computes in float16; an app loads its VAE at its own precision setting (``vae.to(device,
VAE_dtype)``) while the transformer is bfloat16; an app's model cache keeps a "run on CPU" VAE on the cpu. Latents
made for the denoiser then reach the VAE in the denoiser's dtype or on its device. Casting the VAE to them undoes
what the program asked for (the overflow float32 avoids, the user's cpu setting); casting the latents where they
are made breaks the denoiser that reads them too. The fix every such program took is the cast at the call that
hands them to the component: ``self.vae.decode(latents.to(self.vae.dtype) / …)``.

Decided at the failing op, while the program's frames are alive: the op meets the component's own tensors (one
dtype or device) and an input from outside it; the program's own line calls the component (or a method of it) with
a local tensor of the other dtype or device; the component is whole in its dtype or on its device; and the program
put it there on purpose: its config's ``force_upcast`` (float32), a cast of that component at the program's own
line, or a move of it to a device by the program's loading code (a function other than the one using it) and never
to the run's device. The run then goes on with the input cast (or moved) as the fixed line would hand it, so the
component's later ops compute as the fixed program would: one cause, one problem. The fix is that line, a diff,
proven at the failing op on copies of its operands with the input so, and by the rest of the run, which went on
with it so.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from typing import Any

import torch

from torchdoctor._placement import device_str, dtype_str, norm_device, tensor_device
from torchdoctor._virtual.keptfix import KEPT, RECORDS, Kept

__all__ = ["kept_home", "kept_side", "kept_tag"]

_ODD: dict[int, tuple[Any, str]] = {}  # id of an input met at such a site -> (a weak reference to it, its tag)


def kept_tag(t: Any) -> str | None:
    """The tag of an input a failing op met at a kept component's use site (its twin carries it, so the fix that
    sets it is proven on it), or None."""
    hit = _ODD.get(id(t)) if _ODD else None
    return hit[1] if hit is not None and hit[0]() is t else None


def kept_side(rec: Any, p: Any, op: str, groups: dict[Any, list[Any]], with_entries: list[Any],
              call: Any) -> tuple[list[Any], Any] | None:
    """(the input's operands, the component's dtype or device) when the failing op's component is kept so on
    purpose and the program's line hands it the input; else None (the recorder decides as before)."""
    if p.kind not in ("dtype", "device") or len(groups) != 2 or len(with_entries) != 1 or not rec.modules.stack:
        return None
    home = with_entries[0]
    other = next(v for v in groups if v != home)
    try:
        return _judge(rec, p, op, groups, home, other, call)
    except Exception:  # a diagnostic never breaks the program it watches: decided as before
        return None


def _judge(rec: Any, p: Any, op: str, groups: dict[Any, list[Any]], home: Any, other: Any,
           call: Any) -> tuple[list[Any], Any] | None:
    from torchdoctor._guard.usecall import fed_elsewhere, site_call
    from torchdoctor._virtual.tensor import is_entry

    if any(is_entry(call.at(k)) for k in groups[other]):
        return None
    if p.kind == "device" and home == norm_device(rec.device):
        return None  # the component is where the run is: the input is blamed as before, at its maker
    running = rec.modules.stack[0]
    f = _own_frame()
    if f is None:
        return None
    key, miss = (f.f_code.co_filename, f.f_lineno, id(running), p.kind, home, other), _missed(rec)
    if key in miss:
        return None
    hit = site_call(f, f.f_lineno, running, p.kind, other)
    if hit is not None and p.kind == "dtype" and home == (rec.dtype or rec.model_dtype()) and \
            not hit.cast and not fed_elsewhere(f, hit.names, running):
        hit = None  # the component computes in the run's dtype and nothing else reads the input: fixed at its maker
    kept = _why(hit.comp, p.kind, home, f) if hit is not None else None
    if hit is None or kept is None:
        miss.add(key)
        return None
    comp, recv, names, new = hit.comp, hit.recv, hit.names, hit.new
    from torchdoctor._virtual.origin import short_at

    at = short_at(f)
    makers = _makers(f, names, rec, p.kind)
    found = dtype_str(other) if p.kind == "dtype" else device_str(other)
    tag = f"{KEPT}{recv} at {at} ({p.kind})"
    if len(RECORDS) > 256:
        RECORDS.clear()
    RECORDS[tag] = Kept(p.kind, home, f.f_code.co_filename, f.f_lineno, at, new, recv, type(comp).__name__, kept,
                         names, found, makers)
    mpath, mtype = rec.where()
    place = (mpath or "<root>") if mtype else "<top level>"
    rec.sources.setdefault((p.kind, place, op, found), (tag,))
    if len(_ODD) > 256:
        _ODD.clear()
    for k in groups[other]:
        t = call.at(k)
        with contextlib.suppress(TypeError):  # a tensor that takes no weak reference: proven by the run alone
            _ODD[id(t)] = (weakref.ref(t), tag)
    return list(groups[other]), home


def kept_home(rec: Any, found: str, expected: str) -> bool:
    """A module-entry check finds a tensor of the running module on ``found`` while it starts on ``expected``: True
    when its component is kept on ``found`` on purpose and the program's line hands it an input on ``expected`` (the
    op that meets them records the input, once)."""
    from torchdoctor._guard.usecall import site_call
    from torchdoctor._placement import parse_device

    if not rec.modules.stack:
        return False
    try:
        home, other = norm_device(parse_device(found)), norm_device(parse_device(expected))
        if home == norm_device(rec.device):
            return False
        f = _own_frame()
        if f is None:
            return False
        key, miss = (f.f_code.co_filename, f.f_lineno, id(rec.modules.stack[0]), "device", home, other), _missed(rec)
        if key in miss:
            return False
        hit = site_call(f, f.f_lineno, rec.modules.stack[0], "device", other)
        if hit is not None and _why(hit.comp, "device", home, f) is not None:
            return True
        miss.add(key)
        return False
    except Exception:  # a diagnostic never breaks the program it watches: checked as before
        return False


def _missed(rec: Any) -> set[tuple[Any, ...]]:
    """The sites this run already judged not kept (a failing op repeated in a loop is judged once)."""
    miss = rec.__dict__.get("_kept_missed")
    if miss is None or len(miss) > 4096:
        miss = rec.__dict__["_kept_missed"] = set()
    return miss  # type: ignore[no-any-return]


def _own_frame() -> Any:
    """The innermost frame of the program's own files (past torch, torchdoctor and the libraries it calls)."""
    from torchdoctor._virtual.moveby import is_own
    from torchdoctor._virtual.origin import MACHINERY

    f: Any = sys._getframe(3)
    while f is not None and (f.f_code.co_filename.startswith(MACHINERY) or not is_own(f.f_code.co_filename)):
        f = f.f_back
    return f


def _why(comp: torch.nn.Module, kind: str, home: Any, f: Any) -> str | None:
    """Why the component is kept in ``home`` on purpose, said with where it got it; None when nothing says so (it
    is not whole in it, or the program never put it there itself)."""
    from torchdoctor._virtual.modcast import _ACTIVE as active

    tensors = [t for t in (*comp.parameters(), *comp.buffers()) if t.is_floating_point() or kind == "device"]
    if not tensors:
        return None
    if kind == "dtype":
        if any(t.dtype != home for t in tensors if t.is_floating_point()):
            return None
        said = []
        from torchdoctor._guard.kept import kept_upcast

        if home == torch.float32 and kept_upcast(comp):
            said.append("its config sets force_upcast")
        cast = next((c for casts in list(active) if (c := casts.last(comp)) is not None), None)
        if cast is not None and cast[0] == home:
            said.append(f"{cast[3]} casts it to {dtype_str(home)}")
        return f"{type(comp).__name__} computes in {dtype_str(home)} on purpose ({'; '.join(said)})" if said else None
    if any(norm_device(tensor_device(t)) != home for t in tensors) or any(
            "_hf_hook" in vars(m) or "_diffusers_hook" in vars(m) for m in comp.modules()):
        return None  # (an offload hook onloads it for its own forward: ``offloaduse`` fixes where it is used)
    for casts in list(active):
        moves = [(i, x) for i, x in enumerate(casts.moves) if x[0]() is comp]
        if not moves or any(x[1].type != home.type for _, x in moves):
            continue  # never moved by the program, or once to the device it is used on
        i, last = moves[-1]
        trail = casts.trails[i] if i < len(casts.trails) else None
        if trail is None or not trail.frames or trail.frames[0][2] is f.f_code:
            continue  # moved away in the function that uses it: that line is the fix (``awayline``)
        if offload_named(last[2], last[3]):  # put on the program's offload device: to be loaded before its use
            continue
        return f"{type(comp).__name__} is kept on {device_str(home)} on purpose ({last[4]} puts it there)"
    return None


def offload_named(file: str, line: int) -> bool:
    """The program's line moves a module to a device it names an offload (``.to(offload_device)``,
    ``.to(self.offload_device)``): parked there between uses, never kept there on purpose."""
    import linecache
    import re

    return bool(re.search(r"\.to\(\s*[\w.]*offload", linecache.getline(file, line), re.IGNORECASE))


def _makers(f: Any, names: tuple[str, ...], rec: Any, kind: str) -> tuple[str, ...]:
    """Where each input local was made (its dtype: a cast's or factory's line) or moved (its device), as the run
    recorded it: ``", made by cast at app.py:23"``, or ``""``."""
    from torchdoctor._virtual.twins import FAR, tags_of

    first = ("moved a tensor at ", "factory ") if kind == "device" else ("cast at ", "factory ")
    out: list[str] = []
    for n in names:
        t = f.f_locals.get(n, f.f_globals.get(n))
        tags = [x.removeprefix(FAR) for x in tags_of(t, rec.modules.paths)[0]] if isinstance(t, torch.Tensor) else []
        hit = next((x for p in first for x in tags if x.startswith(p)), None)
        out.append("" if hit is None else f", {'moved' if hit.startswith('moved') else 'made by'} " +
                   hit.removeprefix("factory ").removeprefix("moved a tensor "))
    return tuple(out)
