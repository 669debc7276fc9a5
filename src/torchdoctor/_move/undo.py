"""``move``'s undo log: every change is recorded *before* it is made, and undone by what the object really shows.

A record restores state, not history: when it runs it looks at the object, so a change that was interrupted half-way
(an exception, an out-of-memory, a ``KeyboardInterrupt`` between two slots of a tied weight) is undone as far as it
went and no further. After undoing, each record checks its target again; what still differs is reported by path,
so the error's claim ("as before", "lost precision", "these differ") is what the object shows.

Originals: ``rollback="exact"`` keeps every original until the move is done. ``"auto"`` keeps one only where that
costs the filling device nothing (a cross-device move keeps it on the source device) or where a copy could not stand
in for it (a view of a storage the move does not own whole, a storage other units share). Otherwise it holds a weak
reference: a tensor somebody else still holds is alive and comes back itself, exactly; one nobody holds any more is
rebuilt from the moved data (views of one storage from one conversion, so they still share it), and a rebuild through
a narrowing cast is named as having lost precision.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from torchdoctor._placement import compact, same_device
from torchdoctor._walk import Entry, describe, set_tensor

__all__ = ["CastBack", "Outcome", "SetData", "SetSlots", "Swap", "UndoLog", "Unit", "compact_of", "exact_cast",
           "grad_restore", "irreplaceable", "owns_storage", "read_slot"]

_LOSSLESS = {(a, b) for a in (torch.float16, torch.bfloat16) for b in (torch.float32, torch.float64)} | {
    (torch.float32, torch.float64)}


def exact_cast(old: torch.dtype, new: torch.dtype) -> bool:
    """Whether casting ``old`` to ``new`` and back gives the same bits."""
    return old == new or (old, new) in _LOSSLESS


def _storage_id(t: torch.Tensor) -> int | None:
    try:
        return int(t.untyped_storage()._cdata)
    except Exception:  # wrapper subclasses and sparse layouts have no single storage
        return None


def compact_of(t: torch.Tensor) -> str:
    """``bf16[4,4]@cpu`` for any tensor form (nested tensors have no sizes: ragged dimensions show as -1)."""
    try:
        shape = tuple(t.shape)
    except Exception:
        shape = describe(t)[0]
    return compact(t.dtype, shape, t.device)


def _layout(d: torch.Tensor) -> tuple[torch.dtype, torch.device, Any, Any, Any]:
    """(dtype, device, storage offset, size, stride); stride None where there is no plain strided storage."""
    try:
        if d.layout == torch.strided:
            return d.dtype, d.device, d.storage_offset(), d.size(), d.stride()
    except Exception:  # nested tensors and other kinds without one storage
        pass
    return d.dtype, d.device, 0, None, None


def irreplaceable(t: torch.Tensor) -> bool:
    """Whether a rebuilt copy could not stand in for ``t``: it carries autograd history or tensor hooks."""
    try:
        return bool((t.requires_grad and not t.is_leaf) or t._backward_hooks
                    or getattr(t, "_post_accumulate_grad_hooks", None))
    except Exception:
        return True


def owns_storage(t: torch.Tensor) -> bool:
    """Whether ``t`` covers its whole storage (so a rebuilt copy aliases nothing ``t`` aliased)."""
    try:
        return t.storage_offset() == 0 and t.nbytes == t.untyped_storage().nbytes()
    except Exception:
        return True


class Unit:
    """A unit's way back: its members' old layouts, originals (strong or weak) and moved data.

    ``data(i)`` gives member ``i``'s old data and whether it is exact: a kept original, the storage of an original
    that is still alive, or one conversion of the moved storage back (cached, so views keep sharing it).
    """

    def __init__(self, olds: list[torch.Tensor], datas: list[torch.Tensor], keep: bool) -> None:
        self.keep = keep
        self.kept: list[torch.Tensor] | None = list(datas) if keep else None
        if len(olds) == 1:  # the common case, without comprehensions: one member is rebuilt by one ``.to``
            o, d = olds[0], datas[0]
            self.layouts: list[tuple[Any, ...]] = [(d.dtype, d.device, 0, None, None)]
            self.grads = [o.requires_grad and o.is_leaf]
            self.dicts = [_attrs(o)]
            self.objs: list[Any] = [o] if keep else [_weak(o)]
        else:
            self.layouts = [_layout(d) for d in datas]
            self.grads = [o.requires_grad and o.is_leaf for o in olds]
            self.dicts = [_attrs(o) for o in olds]  # the attribute dicts, not the tensors: rebuilt objects get them
            self.objs = list(olds) if keep else [_weak(o) for o in olds]
        self.news: list[torch.Tensor] = []
        self._storage: Any = None
        self._fresh: dict[int, tuple[torch.Tensor, bool]] = {}

    def original(self, i: int) -> torch.Tensor | None:
        o = self.objs[i]
        return o if self.keep else (o() if o is not None else None)

    def data(self, i: int) -> tuple[torch.Tensor, bool]:
        if self.kept is not None:
            return self.kept[i], True
        dt, dev, off, size, stride = self.layouts[i]
        new = self.news[i]
        if len(self.news) == 1 or stride is None:
            return new.to(dev, dt), exact_cast(dt, new.dtype)
        if self._storage is None:
            self._storage = self._old_storage()
        st, exact = self._storage
        return torch.empty(0, dtype=dt, device=dev).set_(st, off, size, stride), exact

    def fresh(self, i: int) -> tuple[torch.Tensor, bool]:
        """A new object for member ``i`` (one per member, so aliased slots get one object)."""
        if i in self._fresh:
            return self._fresh[i]
        data, exact = self.data(i)
        t = data.detach()
        if self.grads[i]:
            t.requires_grad_(True)
        if self.dicts[i]:
            t.__dict__.update(self.dicts[i])
        self._fresh[i] = t, exact
        return t, exact

    def _old_storage(self) -> tuple[Any, bool]:
        for i, ref in enumerate(self.objs):  # an original still alive holds the old storage itself
            o = ref() if ref is not None else None
            if o is not None and not isinstance(o, nn.Parameter) and o.dtype == self.layouts[i][0]:
                return o.untyped_storage(), True
        dt, dev = self.layouts[0][0], self.layouts[0][1]
        new = self.news[0]
        cast = new.dtype != dt
        st = new.untyped_storage()
        flat_new = new.dtype if cast else torch.uint8
        flat = torch.empty(0, dtype=flat_new, device=new.device)
        flat.set_(st, 0, (st.nbytes() // flat.element_size(),), (1,))
        back = flat.to(dev, dt if cast else torch.uint8)
        return back.untyped_storage(), exact_cast(dt, new.dtype)


def _attrs(obj: Any) -> dict[str, Any]:
    try:
        d = object.__getattribute__(obj, "__dict__")
    except Exception:
        return {}
    return d if type(d) is dict else {}


def _weak(t: torch.Tensor) -> Any:
    if isinstance(t, nn.Parameter):
        return None  # Parameters are kept as objects anyway; a weak reference would forbid swap_tensors
    try:
        return weakref.ref(t)
    except TypeError:
        return None


def read_slot(e: Entry) -> Any:
    """What ``e``'s slot holds now (parameter/buffer slot, dict or list item, ``__dict__`` or ``__slots__``)."""
    owner, key = e.owner, e.key
    try:
        if e.slot == "param":
            return owner._parameters.get(key)
        if e.slot == "buffer":
            return owner._buffers.get(key)
        if e.slot == "item":
            return owner[key] if isinstance(owner, (dict, list)) else None
        d = _attrs(owner)
        return d[key] if key in d else object.__getattribute__(owner, key)
    except Exception:
        return None


class Outcome:
    """What a rollback achieved: paths restored through a lossy cast, and rows of what still differs."""

    def __init__(self) -> None:
        self.lossy: list[tuple[str, str]] = []  # (path, what it is again)
        self.differs: list[tuple[str, str, str]] = []  # (path, what it is now, what it was)
        self.interrupt: BaseException | None = None


class _Record:
    path = ""

    def undo(self, out: Outcome) -> None:
        raise NotImplementedError

    def check(self) -> list[tuple[str, str, str]]:
        """(path, now, was) for every slot of the target that still differs from before."""
        raise NotImplementedError


class SetData(_Record):
    """``target.data = new`` (a Parameter's data, or a grad's): undone while the target still holds ``new``;
    ``restore()`` gives the old data and whether it is exact."""

    def __init__(self, target: torch.Tensor, new: torch.Tensor, path: str,
                 restore: Callable[[], tuple[torch.Tensor, bool]], was: str | None = None) -> None:
        self.target, self.new, self.path, self.restore = target, new, path, restore
        self.was = was if was is not None else compact_of(target)

    def moved(self) -> bool:
        new_id = _storage_id(self.new)  # read when undoing: the record holds ``new``, so its storage is the same
        return new_id is not None and _storage_id(self.target) == new_id

    def undo(self, out: Outcome) -> None:
        if not self.moved():
            return  # the change never landed
        data, exact = self.restore()
        self.target.data = data
        if not exact:
            out.lossy.append((self.path, self.was))

    def check(self) -> list[tuple[str, str, str]]:
        t = self.target
        now = compact_of(t)
        return [(self.path, now, self.was)] if self.moved() or now != self.was else []


class CastBack(SetData):
    """``param.data = new`` for a plain Parameter cast on its own device with nothing kept: the way back is one cast
    of the moved data, as ``Unit.data`` gives a one-member unit whose original is not kept, without the unit."""

    def __init__(self, target: torch.Tensor, new: torch.Tensor, path: str, was: str, dtype: torch.dtype) -> None:
        self.target, self.new, self.path, self.was, self.dtype = target, new, path, was, dtype

    def restore(self) -> tuple[torch.Tensor, bool]:  # type: ignore[override]
        new = self.new
        return new.to(self.dtype), exact_cast(self.dtype, new.dtype)


def grad_restore(grad: torch.Tensor, new: torch.Tensor, keep: bool) -> Callable[[], tuple[torch.Tensor, bool]]:
    """The way back for a grad's data: the kept original, or the moved grad converted back."""
    if keep:
        old = grad.data
        return lambda: (old, True)
    dt, dev = grad.dtype, grad.device
    return lambda: (new.to(dev, dt), exact_cast(dt, new.dtype))


class SetSlots(_Record):
    """Every slot of one tensor (aliases and tied weights included) gets ``new``; undone slot by slot as far as
    ``reached`` went, with the original object where it is alive, else one rebuilt object for all slots."""

    def __init__(self, slots: list[Entry], new: torch.Tensor, unit: Unit, i: int, original: torch.Tensor | None,
                 was: str | None = None) -> None:
        self.slots, self.new, self.unit, self.i = slots, new, unit, i
        self.path = slots[0].path
        self.strong = original  # a replaced Parameter: kept whole, it is the object users hold
        self.was = was if was is not None else compact_of(slots[0].tensor)
        self.reached = 0
        self.back: torch.Tensor | None = None

    def undo(self, out: Outcome) -> None:
        back = self.strong if self.strong is not None else self.unit.original(self.i)
        exact = True
        if back is None:
            back, exact = self.unit.fresh(self.i)
        self.back = back
        failed: BaseException | None = None
        for x in reversed(self.slots[:self.reached]):
            try:
                set_tensor(x, back)
            except BaseException as exc:  # the other slots are still put back
                failed = exc
        if not exact:
            out.lossy.append((self.path, self.was))
        if failed is not None:
            raise failed

    def check(self) -> list[tuple[str, str, str]]:
        rows = []
        expected = self.back if self.back is not None else self.strong if self.strong is not None else \
            self.unit.original(self.i)
        for x in self.slots[:self.reached]:
            now = read_slot(x)
            if expected is not None and now is expected:
                continue
            desc = compact_of(now) if isinstance(now, torch.Tensor) else repr(now)
            rows.append((x.path, desc if now is self.new else f"{desc} (another object)", self.was))
        return rows


class Swap(_Record):
    """``torch.utils.swap_tensors(t, holder)`` for wrapper Parameters: swapped back while ``t`` shows the move."""

    def __init__(self, t: torch.Tensor, holder: torch.Tensor, path: str) -> None:
        self.t, self.holder, self.path = t, holder, path
        self.device, self.dtype = t.device, t.dtype
        self.was = compact_of(t)

    def moved(self) -> bool:
        return not (same_device(self.t.device, self.device) and self.t.dtype == self.dtype)

    def undo(self, out: Outcome) -> None:
        if self.moved():
            torch.utils.swap_tensors(self.t, self.holder)

    def check(self) -> list[tuple[str, str, str]]:
        t = self.t
        return [(self.path, compact_of(t), self.was)] if self.moved() else []


class UndoLog:
    """Undo records, newest last, each added before its change."""

    def __init__(self, mode: str) -> None:
        self.mode = mode  # "auto" | "exact" | "off"
        self.records: list[_Record] = []

    def keeps(self, cross_device: bool) -> bool:
        return self.mode == "exact" or (self.mode == "auto" and cross_device)

    def add(self, rec: _Record) -> None:
        if self.mode != "off":
            self.records.append(rec)

    def clear(self) -> None:
        self.records.clear()

    def rollback(self) -> Outcome:
        """Undo every record, newest first, even past a failing one; then say what still differs."""
        out = Outcome()
        while self.records:
            rec = self.records.pop()
            try:
                rec.undo(out)
            except BaseException as exc:  # an interrupt here must not leave the older records undone
                if not isinstance(exc, Exception) and out.interrupt is None:
                    out.interrupt = exc
            try:
                out.differs.extend(rec.check())
            except Exception as exc:
                out.differs.append((rec.path, f"unreadable ({type(exc).__name__})", "?"))
        out.lossy.reverse()
        out.differs.reverse()
        return out
