"""What a cast-only ``move`` must show afterwards (``Expect``), so that its verification needs no second policy and,
for a module tree of plain tensors, no second walk (issue 28, ``docs/move-speed.md``).

A cast-only plan whose cast targets depend on nothing a cast changes leaves an ``Expect``: the plan's canonical
entries with their target dtypes, and the modules it saw. Two ways to check it:

* **Re-reading the planned slots** (``lean``): where the walk found only plain ``Tensor``/``Parameter`` objects in
  module parameter, buffer and ``__dict__`` slots, every module of the tree hangs from the root module's
  ``_modules``, and no torch function or dispatch mode is active when the plan is made, nothing but ``move``'s own
  writes and torch's C++ casts runs between the plan and the check. Then every slot the walk found a tensor in is
  read again: it must hold an object of the planned class with the target dtype, and tied slots one object; and
  the modules must have as many attribute, parameter, buffer and child slots in all as before (a tensor added by
  hand shows there). What only user code could do between the two (put a tensor into a slot that held ``None`` or
  into a non-tensor attribute object) is not looked for; where any condition fails, the walk below decides.
* **A fresh walk** otherwise: exactly the planned canonical paths, each with its target dtype, role, class and
  module, and the same modules.

Either way ``holds`` says True only where a fresh plan finds nothing to do; where anything differs the caller
verifies with the fresh plan, which names what was left behind (``tests/move/test_verify_cast.py``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from torchdoctor._move.owners import is_wrapper
from torchdoctor._placement import PACKED_DTYPES
from torchdoctor._report.model import Target
from torchdoctor._walk import Entry, walk

__all__ = ["Expect"]

_T, _P = torch.Tensor, nn.Parameter
_SLOTS = {"param": "_parameters", "buffer": "_buffers"}


def _no_modes() -> bool:
    """No torch function or dispatch mode is active: a plain tensor's ``.to`` then runs no Python code."""
    try:
        return torch._C._len_torch_function_stack() == 0 and torch._C._len_torch_dispatch_stack() == 0
    except Exception:  # a torch without these counters: take the walk
        return False


def _casts_weights_per_call(policy: Any) -> bool:
    """A layer casts or moves one of its parameters on each call (an app's lowvram layer): what it holds between calls
    is then not the plan's alone. Buffers a forward re-reads per call (transformers' rotary ``inv_freq``, moved to
    the input's device and read as fp32) keep the lean check: the plan decides their dtype as the walk does."""
    casting = policy.casting
    return bool(casting) and any(name in m._parameters for _, m in policy.w.modules if id(m) in casting
                                 for name in casting[id(m)])


class Expect:
    """The result a cast-only move must show (see the module docstring); ``rows``: (canonical entry, target dtype)."""

    __slots__ = ("modules", "rows", "aliases", "tree")

    def __init__(self, modules: list[Any], lean: bool) -> None:
        self.modules = modules
        self.rows: list[tuple[Entry, torch.dtype]] = []
        self.aliases: dict[str, list[Entry]] = {}
        # the modules' attribute, parameter, buffer and child slots, counted; None: check by a fresh walk
        self.tree: int | None = 0 if lean else None

    @classmethod
    def of(cls, w: Any, policy: Any, obj: Any) -> Expect | None:
        dtype = policy.dtype
        if w.problems or w.hooks or w.patches or policy.adapter_of or policy.kbit or _casts_weights_per_call(policy) \
                or dtype.is_complex or dtype in PACKED_DTYPES:
            return None
        mods = [m for _, m in w.modules]
        ex = cls(mods, isinstance(obj, nn.Module) and not getattr(w, "detached", None) and _no_modes()
                 and _lean_entries(w.entries))
        if ex.tree is not None:
            ex.tree = _slot_count(mods)
        return ex

    def holds(self, obj: Any) -> bool:
        """True when ``obj`` shows exactly what the plan made; False when anything differs (the caller then verifies
        with a fresh plan, which says what)."""
        if isinstance(obj, Target):
            obj = obj.obj
        if self.tree is not None:
            try:
                return self._reread()
            except Exception:  # a slot table replaced by something else: the walk reads what it can
                return False
        return self._walk(obj)

    def _reread(self) -> bool:
        if _slot_count(self.modules) != self.tree:
            return False
        aliases = self.aliases
        for e, dt in self.rows:
            now = _slot(e)
            old = e.tensor
            if type(now) is not type(old) or now.dtype != dt:
                return False
            for a in aliases.get(e.path, ()):
                if _slot(a) is not now:
                    return False  # a tie came apart
        return True

    def _walk(self, obj: Any) -> bool:
        w = walk(obj)
        if w.problems or w.hooks or w.patches or len(w.modules) != len(self.modules) or \
                any(m is not n for (_, m), n in zip(w.modules, self.modules)):
            return False
        seen = {e.path: (dt, e.role, type(e.tensor), id(e.module)) for e, dt in self.rows}
        for e in w.entries:
            if e.alias_of is not None or e.role == "offloaded" or (e.slot == "inner" and is_wrapper(e.owner)):
                continue
            t = e.tensor
            was = seen.get(e.path)
            if was is None or was[0] != t.dtype or was[1] != e.role or was[2] is not type(t) or \
                    was[3] != id(e.module):
                return False
        return True


def _lean_entries(entries: list[Entry]) -> bool:
    """Whether every tensor the walk found sits in a module's parameter, buffer or ``__dict__`` slot, as a plain
    ``Tensor``/``Parameter`` (no tensor inside another object, a container or a subclass)."""
    for e in entries:
        tp = type(e.tensor)
        if tp is not _T and tp is not _P:
            return False
        slot = e.slot
        if slot not in _SLOTS and not (slot == "attr" and e.role == "attribute" and e.owner is e.module
                                       and e.module is not None):
            return False
    return True


def _slot_count(mods: list[Any]) -> int:
    """How many attribute, parameter, buffer and child slots the modules have (a slot added anywhere shows)."""
    n = 0
    for m in mods:
        d = m.__dict__
        n += len(d) + len(d["_parameters"]) + len(d["_buffers"]) + len(d["_modules"])
    return n


def _slot(e: Entry) -> Any:
    """What ``e``'s slot holds now (only the slots ``_lean_entries`` admits)."""
    slot = e.slot
    if slot == "param":
        return e.owner._parameters.get(e.key)
    if slot == "buffer":
        return e.owner._buffers.get(e.key)
    return e.owner.__dict__.get(e.key)
