"""What a trace reads of an object around a call: placement per tensor path, and the objects met.

A full read is one walk (``_walk.walk``). A module tree whose walk holds only what ``Module.to`` sees —
plain parameters and buffers, plain tensors set as module attributes, and attribute objects holding no tensor
(a transformers config) — keeps the walk's *shape*: every module's ``__dict__`` keys, its children by name and
identity, its parameter and buffer names. The next read follows that shape and re-reads every slot
(``_parameters[name]``, ``_buffers[name]``, each attribute), so a tensor written straight into a slot,
swapped in place (``torch.utils.swap_tensors``) or cast through ``.data`` is seen as before; anything the shape
does not hold (a module added or removed, a new key, a tensor with attributes of its own such as
``weight.quant_state``, a tensor put into an attribute object) makes the read walk again. The attribute
objects are walked on every read, alone (they are small), to prove they still hold no tensor. Once a slow read
has succeeded, the same read is made from flat lists compared at C speed (``flat.py``) until the tree changes.

Snapshots hold the tensors themselves, never weak references: ``torch.utils.swap_tensors`` refuses a tensor
that has one (and with it ``Module.to`` of tensor subclasses and of torch's swap mode). A snapshot lives for
one call; what a trace keeps between calls drops the tensors (``strip``).
"""

from __future__ import annotations

import weakref
from collections import deque
from itertools import repeat
from operator import itemgetter
from typing import Any

import torch
from torch import nn

from torchdoctor._trace.flat import Flat, inert
from torchdoctor._walk.kinds import FAST_ATOMS

# path -> (the tensor, or None once stripped; its id; device; dtype)
Snap = dict[str, tuple[Any, int, torch.device, torch.dtype]]
Objects = dict[int, tuple[str, Any]]  # id -> (scope path, weak reference to the object, or None for a tensor)
Read = tuple[Snap, Objects, dict[str, Any]]

# nn.Module's own bookkeeping, which the walker never reads as user data; keys the walker treats specially
# (accelerate / diffusers hooks, a forward replaced on the instance) make a module always walked.
_INTERNALS = frozenset(nn.Module().__dict__)
_WALKED = frozenset({"_hf_hook", "_old_forward", "forward", "_diffusers_hook", "__dict__"})
_T, _P = torch.Tensor, nn.Parameter
_0, _1, _2, _3 = map(itemgetter, range(4))


def ref(obj: Any) -> Any:
    try:
        return weakref.ref(obj)
    except TypeError:
        return None


def strip(snap: Snap) -> Snap:
    """The snapshot without its tensors (what a trace keeps between calls must not keep tensors alive)."""
    v = snap.values()
    return dict(zip(snap, zip(repeat(None), map(_1, v), map(_2, v), map(_3, v))))


def drop(d: dict[Any, Any], keys: Any) -> None:
    """``d.pop(k, None)`` for each of ``keys`` (a per-call bookkeeping step: at C speed)."""
    deque(map(d.pop, keys, repeat(None)), maxlen=0)


def owned(owner: Any, objects: Objects) -> Any:
    """``(id, (owner, scope, ref))`` for each of ``objects``, to update a session's objects at C speed."""
    v = objects.values()
    return zip(objects, zip(repeat(owner), map(_0, v), map(_1, v)))


def full(obj: Any, prefix: str) -> tuple[Read, Any]:
    """Walk ``obj`` (found at ``prefix``): placement per tensor path, ``id -> (scope, ref)`` of the modules,
    tensors and tensor owners met, ``path -> ref`` of the modules; and the walk itself."""
    from torchdoctor._walk import walk  # the walker and its report types load with the first read, not at start

    w = walk(obj)
    join = prefix + "." if prefix else ""
    snap: Snap = {}
    objects: Objects = {}
    modules: dict[str, Any] = {}
    for mpath, mod in w.modules:
        path = join + mpath if mpath else prefix
        r = ref(mod)
        objects[id(mod)] = (path, r)
        modules[path] = r
    for e in w.entries:
        if e.alias_of is not None:
            continue
        t = e.tensor
        path = join + e.path
        snap[path] = (t, id(t), t.device, t.dtype)
        scope = join + e.module_path if e.module_path else prefix
        objects[id(t)] = (scope, None)
        owner = e.owner
        if owner is not None and not isinstance(owner, (nn.Module, dict, list, tuple)) and id(owner) not in objects:
            oref = ref(owner)
            if oref is not None:
                objects[id(owner)] = (scope, oref)
    return (snap, objects, modules), w


_MISSES = 4  # flat reads that missed before a shape stops priming them


class Shape:
    """What the last walk of one module tree found, to re-read its slots without walking (see the docstring)."""

    __slots__ = ("target", "mods", "objects", "modules", "flat", "misses")

    def __init__(self, target: nn.Module, mods: list[tuple[Any, ...]], objects: Objects,
                 modules: dict[str, Any]) -> None:
        self.target = weakref.ref(target)
        self.mods = mods
        self.objects = objects
        self.modules = modules
        self.flat: Flat | None = None
        self.misses = 0

    @classmethod
    def of(cls, obj: Any, prefix: str, read: Read, w: Any) -> Shape | None:
        """The shape of this walk, or None when a lean read could not make the same snapshot."""
        if not isinstance(obj, nn.Module) or w.problems or w.hooks or w.patches or w.detached or len(w.roots) != 1:
            return None
        for e in w.entries:
            t = e.tensor
            if type(t) is not _T and type(t) is not _P:
                return None  # subclasses: their parts need the walker
            if e.role == "attribute" and not (e.slot == "attr" and e.module is not None and e.owner is e.module):
                return None  # a tensor inside an attribute object or a container
            if e.role not in ("parameter", "buffer", "attribute"):
                return None
        join = prefix + "." if prefix else ""
        mods: list[tuple[Any, ...]] = []
        children = 0
        for mpath, mod in w.modules:
            d = mod.__dict__
            keys = frozenset(d)
            sub, pd, bd = d.get("_modules"), d.get("_parameters"), d.get("_buffers")
            if keys & _WALKED or type(sub) is not dict or type(pd) is not dict or type(bd) is not dict:
                return None
            children += sum(1 for c in dict.values(sub) if isinstance(c, nn.Module))
            path = join + mpath if mpath else prefix
            pre = path + "." if path else ""
            attrs = tuple((k, pre + k) for k in sorted(keys - _INTERNALS))  # the walker's order: sorted keys
            mods.append((weakref.ref(mod), (path, None), keys, attrs, tuple(sub), tuple(map(id, dict.values(sub))),
                         {n: pre + n for n in pd}, {n: pre + n for n in bd}))
        if children + 1 != len(w.modules):
            return None  # a module reached twice (or a cycle): the walker's order has repeats this shape lacks
        snap, objects, modules = read
        shape = cls(obj, mods, {k: v for k, v in objects.items() if v[1] is not None}, modules)
        try:  # primed now, from the walk (which the slow read equals): a trace's first call reads flat
            shape.flat = Flat.prime(mods, snap, objects)
        except Exception:
            shape.flat = None
        return shape

    def read(self) -> Read | None:
        """The snapshot the walk would make now, or None when the tree no longer has this shape: the flat
        read first (``flat.py``), else slot by slot (and the flat read primed from it)."""
        flat = self.flat
        if flat is not None:
            try:
                got = flat.read(self.objects, self.modules)
            except Exception:  # a slot dict replaced by something else: the slower reads decide
                got = None
            if got is not None:
                return got
            self.misses += 1
        try:
            got = self._read()
        except Exception:  # a slot dict replaced by something else: the walker reads what it can
            return None
        # a tree whose shape keeps changing between reads (a forward that sets attributes of new types)
        # would pay a priming per read: after a few misses it is read slot by slot only
        if got is not None and self.misses < _MISSES:
            try:
                self.flat = Flat.prime(self.mods, got[0], got[1])
            except Exception:
                self.flat = None
        return got

    def _read(self) -> Read | None:
        snap: Snap = {}
        objects = dict(self.objects)  # the modules; a tensor's id cannot be one of theirs while they live
        later: list[Any] = []  # buffers, then attribute tensors: flat (path, tensor, scope) triples
        attrs: list[Any] = []
        others: dict[int, Any] = {}
        atoms = FAST_ATOMS
        for mref, scope, keys, akeys, names, kids, ppaths, bpaths in self.mods:
            mod = mref()
            if mod is None:
                return None
            d = mod.__dict__
            if d.keys() != keys:
                return None
            sub = d["_modules"]
            if (names or sub) and (tuple(sub) != names or tuple(map(id, dict.values(sub))) != kids):
                return None
            slots = d["_parameters"]
            for name, t in dict.items(slots):  # parameters first: the walker's canonical order
                if t is None:
                    continue
                p = ppaths.get(name)
                if p is None or type(t) is not _T and type(t) is not _P:
                    return None
                td = t.__dict__
                if td:  # a tensor's own attributes: quant_state hangs here (and the walk must see it)
                    for v in td.values():
                        if type(v) not in atoms:
                            others[id(v)] = v
                i = id(t)
                if i not in objects:  # a tied weight: its first path is the one
                    snap[p] = (t, i, t.device, t.dtype)
                    objects[i] = scope
            slots = d["_buffers"]
            for name, t in dict.items(slots):
                if t is None:
                    continue
                p = bpaths.get(name)
                if p is None or type(t) is not _T and type(t) is not _P:
                    return None
                td = t.__dict__
                if td:  # transformers marks buffers (_is_buffer, persistent)
                    for v in td.values():
                        if type(v) not in atoms:
                            others[id(v)] = v
                later += (p, t, scope)
            for key, p in akeys:
                v = d[key]
                tv = type(v)
                if tv in atoms:
                    continue
                if tv is _T or tv is _P:
                    for x in v.__dict__.values():
                        if type(x) not in atoms:
                            others[id(x)] = x
                    attrs += (p, v, scope)
                else:
                    others[id(v)] = v
        if others and not inert(list(others.values())):
            return None  # an attribute object may hold a tensor or a module now: walk it all
        later += attrs
        for k in range(0, len(later), 3):
            t = later[k + 1]
            i = id(t)
            if i not in objects:
                snap[later[k]] = (t, i, t.device, t.dtype)
                objects[i] = later[k + 2]
        return snap, objects, dict(self.modules)


def snapshot(obj: Any, prefix: str, shapes: dict[tuple[int, str], Shape | None] | None = None) -> Read:
    """The snapshot of ``obj`` at ``prefix``: re-read along the cached shape in ``shapes`` when it still holds,
    else walked (and the shape kept for the next read)."""
    if shapes is not None:
        key = (id(obj), prefix)
        if key in shapes and shapes[key] is None:
            return full(obj, prefix)[0]  # this object never had a lean shape: walk it, as before
        shape = shapes.get(key)
        if shape is not None and shape.target() is obj:
            got = shape.read()
            if got is not None:
                return got
        read, w = full(obj, prefix)
        shapes[key] = Shape.of(obj, prefix, read, w) if isinstance(obj, nn.Module) else None
        return read
    return full(obj, prefix)[0]
