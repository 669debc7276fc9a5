"""The casts of a dtype check on the CPU (``simulate(..., device="cpu", dtype=torch.float16)``): a tensor the
program casts to another floating dtype (``x.float()``, ``h.to(self.compute_dtype)``, ``.to(torch.float32)``) is
named by that cast, its line and where its dtype was read from, as a virtual run names it, so the fix is written at
that line (or at the attribute), never as "pass the tensors made in float32 ...".

The tensors on the CPU are real, so no provenance rides on them: the casts' results are kept by id (with a weak
reference), and what only they made (a view, a reshape inside ``F.linear``) takes their record. In a proof's re-run
the casts at a fixed line write the fixed dtype (``recast``), as ``makers.CastMakers`` does for a virtual run.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from torchdoctor._virtual.castsites import CastSite, cast_site
from torchdoctor._virtual.origin import short_at, user_frame

_CAST_METHODS = frozenset({"to", "float", "half", "double", "bfloat16", "type", "type_as"})
_LIMIT = 4096  # records kept per run (the dict is cleared of dead ones when it is full)


class CastRecords:
    """The cast sites of one run's tensors, by id, and the lines a proof re-casts."""

    def __init__(self, where: Callable[[], tuple[str | None, str | None]] | None = None) -> None:
        self.recast: dict[tuple[str, int], torch.dtype] = {}
        self.where = where  # the running module's path and type, when a cast runs
        self.sites: dict[int, tuple[weakref.ref[torch.Tensor], CastSite, str]] = {}
        # what several makers made together (``w * s``: a default-dtype factory's tensor and a cast's): each maker's
        # words and source for the fix, so every line that gave it its dtype is fixed, none lost one op downstream
        self.mixed: dict[int, tuple[weakref.ref[torch.Tensor], tuple[tuple[str, str], ...]]] = {}

    def of(self, t: Any) -> CastSite | None:
        hit = self.sites.get(id(t)) if isinstance(t, torch.Tensor) else None
        return hit[1] if hit is not None and hit[0]() is t else None

    def place(self, t: Any) -> str:
        """The module the cast of ``t`` ran in (``<root>``), as problems write it."""
        hit = self.sites.get(id(t))
        return hit[2] if hit is not None else "<root>"

    def keep(self, t: torch.Tensor, site: CastSite, place: str | None = None) -> None:
        if len(self.sites) >= _LIMIT:
            for k in [k for k, (ref, _, _) in self.sites.items() if ref() is None]:
                del self.sites[k]
            if len(self.sites) >= _LIMIT:
                return
        try:
            if place is None:
                mpath, mtype = self.where() if self.where is not None else (None, None)
                place = (mpath or "<root>") if mtype else "code outside the model"
            self.sites[id(t)] = (weakref.ref(t), site, place)
        except TypeError:  # a tensor type without weak references: not named
            return

    def made(self, func: Any, args: Any, out: Any) -> Any:
        """``out`` of torch function ``func``: a cast of a floating tensor to another floating dtype at a line of
        the program is kept with its site (re-cast when a proof fixed that line)."""
        if getattr(func, "__name__", None) not in _CAST_METHODS or not args:
            return out
        t = args[0]
        if not isinstance(t, torch.Tensor) or not isinstance(out, torch.Tensor) or not out.is_floating_point() or \
                not t.is_floating_point():
            return out
        if out.dtype == t.dtype and not _names_dtype(func, args):  # a move, or a copy: no dtype was chosen there
            return out
        f = user_frame(2)
        if f is None:
            return out
        want = self.recast.get((f.f_code.co_filename, f.f_lineno))
        if want is not None and out.dtype != want:  # the fix at this line, applied in a proof's re-run
            out = out.to(want)
        site = cast_site(f, short_at(f), out.dtype)
        if site is not None:
            self.keep(out, site)
        return out

    def follow(self, ins: list[torch.Tensor], outs: list[torch.Tensor], named: Any,
               factory: Callable[[torch.Tensor], tuple[str, str | None] | None] | None = None) -> None:
        """What only a cast's result made (a view, a reshape), in its dtype, takes the cast's record; model tensors
        (``named``) among the inputs do not count against it. What several makers made together (a cast's result
        times a default-dtype ``factory``'s tensor, two casts), through any number of ops, takes all their records
        (``makers_of``)."""
        if not outs or not (self.sites or self.mixed):
            return
        cast = [t for t in ins if self.of(t) is not None]
        if cast and not any(self.of(t) is None and id(t) not in named for t in ins) and \
                len({getattr(self.of(t), 'at', None) for t in cast}) == 1:
            site = self.of(cast[0])
            for t in outs:
                if site is not None and t.dtype == site.dtype:
                    self.keep(t, site, self.place(cast[0]))
            return
        if factory is None:
            return
        dtype = outs[0].dtype  # the inputs that set it: an operand in another dtype took no part in it
        makers: dict[tuple[str, str], None] = {}
        for t in ins:
            if id(t) in named or t.dtype != dtype:
                continue
            mine = self.makers_of(t, factory)
            if not mine:
                return  # an input nothing names: not all its makers are known
            makers.update(dict.fromkeys(mine))
        if len(makers) < 2:
            return
        for t in outs:
            if t.dtype == dtype and len(self.mixed) < _LIMIT:
                try:
                    self.mixed[id(t)] = (weakref.ref(t), tuple(makers)[:8])
                except TypeError:
                    return

    def makers_of(self, t: torch.Tensor, factory: Callable[[torch.Tensor], tuple[str, str | None] | None]
                  ) -> tuple[tuple[str, str], ...]:
        """(words, source) of each maker of ``t``: its cast, its default-dtype factory, or the makers of a mix."""
        site = self.of(t)
        if site is not None:
            return (cast_words(site, self.place(t))[0].removeprefix("a tensor made by "), f"cast at {site.at}"),
        made = factory(t)
        if made is not None:
            place = self.where()[0] if self.where is not None else None
            at = f" at {made[1]}" if made[1] else ""
            return (f"{made[0]}{at} (no dtype given)", f"factory {made[0]} in `{place or '<root>'}`{at}"),
        hit = self.mixed.get(id(t))
        return hit[1] if hit is not None and hit[0]() is t else ()


_DTYPE_METHODS = frozenset({"float", "half", "double", "bfloat16"})


def _names_dtype(func: Any, args: Any) -> bool:
    """A cast that writes its dtype (``.float()``, ``.to(self.compute_dtype)``) chose it even where the tensor has it
    already: a factory's float32 cast ``.to(torch.float32)`` after it is the line that sets its dtype, so a fix of the
    factory alone is undone there."""
    return getattr(func, "__name__", None) in _DTYPE_METHODS or any(isinstance(a, torch.dtype) for a in args[1:])


def cast_words(site: CastSite, place: str) -> tuple[str, tuple[str, ...]]:
    """How a problem names a tensor a cast made in module ``place``, and its source for the fix (``cast at
    app.py:9``)."""
    where = place if place == "code outside the model" else f"`{place}`"
    return f"a tensor made by {site.describe()} in {where}", (f"cast at {site.at}",)


def mixed_words(makers: tuple[tuple[str, str], ...]) -> tuple[str, tuple[str, ...]]:
    """How a problem names a tensor several makers made, and the sources of the fix: every one of them."""
    return f"a tensor made from {', '.join(w for w, _ in makers[:-1])} and {makers[-1][0]}", tuple(s for _, s in makers)
