"""A move at the program's own line as the maker of where a tensor is: ``bias = torch.ones(8).cuda()`` made the
tensor with a factory, but the ``.cuda()`` put it on cuda:0, so a device problem it causes on a cuda:1 run is fixed
at the move (``.to(x.device)``), never by a ``device=`` given to the factory, which the move undoes. Recorded only
when a tensor the run already has a record for crosses devices, at a line of the program's own file (a library's
hook that moves a layer's inputs is no line of the program's), so nothing is added to the per-op path.
"""

from __future__ import annotations

from typing import Any

import torch

from torchdoctor._virtual.origin import LINES, Made, short_at, user_frame

OWN: dict[str, bool] = {}  # a frame's file name -> it is the program's own (``ownfile.own_file``), per process
# a move's "file:line" -> the tensor arguments of its function and their devices when it ran: a fix can move the
# tensor to the device of one of them (``x.device``), read from the program's own names
ARGS: dict[str, tuple[tuple[str, str], ...]] = {}
# the same for its device arguments (``set_timesteps(self, n, device=None)`` called with ``device="cuda"``): a fix can
# move the tensor there (``.to(device)``) where the function was given the device the failing op runs on
DEVARGS: dict[str, tuple[tuple[str, str], ...]] = {}


def is_own(name: str) -> bool:
    hit = OWN.get(name)
    if hit is None:
        from torchdoctor._guard.ownfile import own_file

        hit = OWN[name] = own_file(name) if len(OWN) < 4096 else False
    return hit


def carried(made: Made | None, module: Any, cast: torch.dtype | None = None) -> Made | None:
    """``made``'s tensor sent to another device by the program's line running now: a record of that move, whose
    line is the device's maker (``Made.placed_by`` stops there) while the dtype still comes from ``made``; ``made``
    itself when the line is not the program's own. Called by the run's move of a tensor to another device.
    ``cast``: the move also cast it to that dtype (``x.to(device, dtype=weight_dtype)``): the line chose the dtype, so
    it is the dtype's maker too (``Made.source`` stops there), never the op that made ``x`` in another dtype."""
    if made is None:
        return None
    f = user_frame(3)
    if f is None or not is_own(f.f_code.co_filename):
        return made
    at = short_at(f)
    if cast is not None and (site := _site(f, at, cast)) is not None:  # the dtype's link, then the device's
        made = Made("Tensor.to", module, (f"cast at {at}",), 1, via=made, depth=made.depth + 1)
        made.site, made.at = site, at
    m = Made("Tensor.to", module, via=made, depth=made.depth + 1)
    m.at, m.moves = at, True
    LINES.setdefault(m.at, (f.f_code.co_filename, f.f_lineno))
    note_args(f, m.at)
    return m


def moved_in(cast: torch.dtype | None) -> Made:
    """The record of a tensor made before the run and moved (or cast) at the program's line outside any module: that
    line (``Tensor.to at app.py:7``); with ``cast`` (it changed the dtype too) the line is the dtype's maker, a cast
    site, as ``carried`` records it."""
    m = Made("Tensor.to", None)
    f = user_frame(3) if cast is not None else None
    if cast is None or f is None or not is_own(f.f_code.co_filename) or (site := _site(f, short_at(f), cast)) is None:
        return m
    c = Made("Tensor.to", None, (f"cast at {site.at}",), 1)
    c.site, c.at = site, site.at
    m = Made("Tensor.to", None, via=c, depth=2)
    m.at, m.moves = site.at, True
    LINES.setdefault(site.at, (f.f_code.co_filename, f.f_lineno))
    return m


def _site(f: Any, at: str, dtype: torch.dtype) -> Any:
    from torchdoctor._virtual.castsites import cast_site

    return cast_site(f, at, dtype)


def note_args(f: Any, at: str) -> None:
    """Keep the tensor and device arguments of the function whose line ``at`` (frame ``f``) moves a tensor."""
    if at in ARGS or len(ARGS) >= 4096:
        return
    from torchdoctor._placement import device_str, tensor_device

    code = f.f_code
    ARGS[at] = tuple((n, device_str(tensor_device(v))) for n in code.co_varnames[:code.co_argcount]
                     if isinstance(v := f.f_locals.get(n), torch.Tensor))
    DEVARGS[at] = tuple((n, d) for n in code.co_varnames[:code.co_argcount]
                        if "device" in n and (d := _device_named(f.f_locals.get(n))) is not None)


def _device_named(v: Any) -> str | None:
    """``cuda:0`` for a device argument (``"cuda"``, ``torch.device("cuda", 0)``, ``0``), else None."""
    from torchdoctor._placement import device_str, norm_device

    if not isinstance(v, (str, torch.device)) or isinstance(v, bool):
        return None
    try:
        return device_str(norm_device(torch.device(v)))
    except (RuntimeError, TypeError, ValueError):
        return None
