"""A module tree's walk kept for the next call, and proved still true at C speed before it is reused.

``scan`` is called again and again on one model (a test suite, a notebook cell re-run, an app checking after each
load). A walk of a plain module tree is a function of what it reads: each module's class and ``__dict__`` keys in
order, the three slot dicts' keys and values, the attributes' values (plain values by type; anything else must be a
tensor-free tree of dicts, lists, tuples, sets and plain objects, read here by identity), the tensors' classes and
their own attributes, and whether a module has forward hooks. ``Kept`` holds those reads as flat lists and re-reads
them from the live tree with ``map`` and ``chain``; when every list is equal, the walk would read exactly what it read
before, so its entries are made again from the kept paths and the tensors now in those slots (fresh ``Entry``
objects: callers may change theirs). Anything unequal, dead or unusual returns None, and the walker decides.

A tree is kept only when its walk met nothing but modules, parameters, buffers and such attributes: no accelerate or
diffusers hook, replaced ``forward``, TorchScript or compiled wrapper, forward hooks, tensor attribute, module held
outside the tree, function, slotted object or truncation. Modules and tensors are held by weak reference (a kept
walk never keeps a model alive); the attribute trees, which hold neither, are held so that their identities stay
valid.
"""

from __future__ import annotations

import types
import weakref
from itertools import chain
from operator import attrgetter, is_, itemgetter
from typing import Any

import torch
from torch import nn

from torchdoctor._walk.entry import Entry, Walk
from torchdoctor._walk.kinds import ATOM, FAST_ATOMS, HOOK, MAPPING, OBJ, SKIP, class_keys, instance_dict, kind

__all__ = ["Kept", "kept_walk"]

_deref = weakref.ref.__call__
_dict = attrgetter("__dict__")
_values = dict.values
_flat = chain.from_iterable
_PLAIN_TENSORS = frozenset({torch.Tensor, nn.Parameter})
_SLOTS = ("_parameters", "_buffers", "_modules")
_EXACT = frozenset({list, tuple, set, frozenset})
_INERT_LIMIT = 5_000  # objects in one tree's attributes; beyond, the walker decides each time
# id(root) -> its kept walk (the root held by weak reference, checked on use), or (its weak reference, walks left
# before priming): 0 after a tree's first walk, _RETRY after one that could not be kept (priming costs more than a
# walk: not paid on every scan of a tree that cannot be kept)
_KEPT: dict[int, Any] = {}
_RETRY = 15
_MAX_KEPT = 16


def kept_walk(root: nn.Module, walk: Any) -> Walk:
    """``walk(root)``, reusing the last walk of this very tree when ``Kept.read`` proves it unchanged. A tree is
    kept from its second walk on: priming costs more than a walk, which a tree scanned once never repays."""
    k: Any = _KEPT.get(id(root))
    again = k is not None and (k.root() if type(k) is Kept else k[0]()) is root
    if again and type(k) is Kept:
        w = k.read(root)
        if w is not None:
            return w
    elif again and k[1] > 0:  # refused lately: walked without priming for a while
        _KEPT[id(root)] = (k[0], k[1] - 1)
        return walk(root)  # type: ignore[no-any-return]
    w = walk(root)
    if len(_KEPT) >= _MAX_KEPT:
        _KEPT.clear()
    _KEPT[id(root)] = (Kept.prime(root, w) or (weakref.ref(root), _RETRY)) if again else (weakref.ref(root), 0)
    return w  # type: ignore[no-any-return]


def _inert(roots: list[Any], objs: list[Any], views: list[Any]) -> bool:
    """Whether every value reachable from ``roots`` is a plain value or an exact dict, list, tuple, set or plain
    object (no slots) holding such values: nothing the walker would make an entry, a module or a problem of. Fills
    ``objs`` with each container and object read and ``views`` with what identity must find in them again."""
    stack = list(roots)
    seen: set[int] = set()
    atoms = FAST_ATOMS
    while stack:
        v = stack.pop()
        tp = type(v)
        if tp in atoms:
            continue
        if id(v) in seen:
            continue
        k = kind(v)
        if k == ATOM and tp is not memoryview or k == SKIP and (tp is type or tp is types.ModuleType) or \
                isinstance(v, type):
            continue  # the walker skips these whatever they hold; kept here, they keep nothing else alive
        if k == ATOM or k == SKIP or k == HOOK:
            return False  # a bound method, frame or hook held here would keep its module or tensors alive
        seen.add(id(v))
        if len(seen) > _INERT_LIMIT:
            return False
        if k == MAPPING:
            keys, vals = dict.keys(v), dict.values(v)
            views.append(keys)
            views.append(vals)
            stack.extend(keys)
            stack.extend(vals)
        elif tp in _EXACT:
            views.append(v)
            stack.extend(v)
        elif k == OBJ and not hasattr(tp, "__slots__"):
            d = instance_dict(v)
            if d is None:
                return False
            views.append(dict.values(d))  # its keys are names: the walker reads its values only
            stack.extend(d.values())
            objs.append(d)  # the object's own dict, by identity below
        else:  # tensors, modules, functions, partials, deques, slotted objects, container subclasses
            return False
        objs.append(v)
    return True


def _picker(at: list[int]) -> Any:
    """``vals -> tuple(vals[i] for i in at)`` at C speed (``itemgetter`` of one place returns the value alone)."""
    if not at:
        return lambda vals: ()
    return itemgetter(*at, at[0]) if len(at) == 1 else itemgetter(*at)


class Kept:
    """One walk's reads as flat lists (see the module docstring)."""

    __slots__ = ("root", "refs", "types", "keys", "at_mod", "at_key", "vtypes", "held_at", "held", "slot_at",
                 "held_of", "slots_of",
                 "slot_keys", "slot_ids", "trefs", "ttypes", "objs", "otypes", "owners", "odicts", "views", "flat",
                 "paths", "typeset", "rows", "root_path", "__weakref__")
    root: weakref.ref[nn.Module]
    root_path: str
    refs: list[weakref.ref[nn.Module]]  # the modules in the walk's order
    types: list[type]
    keys: list[Any]  # every module's __dict__ keys in order, flat
    at_mod: list[int]  # (module, key) of each value read: the slot dicts and the attributes
    at_key: list[str]
    vtypes: list[type]
    held_at: list[int]  # where the attributes that are not plain values are, and those objects
    held: list[Any]
    slot_at: list[int]
    held_of: Any  # the values at held_at and at slot_at, picked at C speed (always a tuple)
    slots_of: Any
    slot_keys: list[Any]
    slot_ids: list[int]  # each slot value's place in [*modules, *tensors, None]
    trefs: list[weakref.ref[torch.Tensor]]
    ttypes: list[type]
    objs: list[Any]  # the attributes' containers and objects, their types, the objects' dicts
    otypes: list[type]
    owners: list[Any]
    odicts: list[Any]
    views: list[Any]  # what identity must find in them again, and what it found
    flat: list[Any]
    paths: list[str]
    typeset: set[type]  # the walk's classes, copied into each walk made from this (its module_paths follow
    # from its modules)
    rows: list[tuple[Any, ...]]  # each entry: path, role, tensor, module (places), key, slot, module path, flags

    @classmethod
    def prime(cls, root: nn.Module, w: Walk) -> Kept | None:
        if w.problems or w.hooks or w.hooked or w.patches or w.holders or w.detached or len(w.roots) != 1 \
                or w.roots[0][1] is not root:
            return None
        mods = [m for _, m in w.modules]
        entries = w.entries
        tensors = [e.tensor for e in entries]
        if not _PLAIN_TENSORS.issuperset(map(type, tensors)) or not FAST_ATOMS.issuperset(map(type, _flat(map(
                _values, map(_dict, tensors))))):
            return None
        self = cls()
        index = {id(m): i for i, m in enumerate(mods)}
        tindex: dict[int, int] = {}
        for e in entries:
            if e.slot not in ("param", "buffer") or e.owner is not e.module or id(e.module) not in index:
                return None
            tindex.setdefault(id(e.tensor), len(tindex))
        uniq = list({id(t): t for t in tensors}.values())
        rid = id(root)

        def forget(_: Any) -> None:  # the model is gone: drop what was kept for it (its configs, plans) now
            try:
                if _KEPT.get(rid) is self:
                    _KEPT.pop(rid, None)
            except Exception:  # at interpreter shutdown the table may be gone already
                pass

        self.root, self.root_path = weakref.ref(root, forget), w.roots[0][0]
        self.refs = [weakref.ref(m) for m in mods]
        self.types = [type(m) for m in mods]
        ds = [m.__dict__ for m in mods]
        self.keys = list(_flat(ds))
        self.at_mod, self.at_key, self.slot_at, self.held_at = [], [], [], []
        attrs: list[Any] = []
        for i, (m, d) in enumerate(zip(mods, ds)):
            hit = class_keys(type(m), d)
            if hit[2] or hit[3] or hit[4] or hit[10] or d.get("_forward_hooks"):
                return None  # hooks of accelerate or diffusers, a replaced forward, TorchScript, torch.compile
            for key in _SLOTS:
                if key in d:
                    slot = d[key]
                    if type(slot) is not dict:
                        return None
                    for v in slot.values():
                        if v is not None and id(v) not in (index if key == "_modules" else tindex):
                            return None  # something the walker skips: its identity could be a new object's
                    self.slot_at.append(len(self.at_key))
                    self.at_mod.append(i)
                    self.at_key.append(key)
            for key in hit[1]:
                v = d[key]
                if type(v) not in FAST_ATOMS:
                    self.held_at.append(len(self.at_key))
                    attrs.append(v)
                self.at_mod.append(i)
                self.at_key.append(key)
        objs: list[Any] = []
        views: list[Any] = []
        if not _inert(attrs, objs, views):
            return None
        vals = list(map(dict.__getitem__, map(ds.__getitem__, self.at_mod), self.at_key))
        self.vtypes = list(map(type, vals))
        self.held_of, self.slots_of = _picker(self.held_at), _picker(self.slot_at)
        self.held = list(self.held_of(vals))
        slots = list(self.slots_of(vals))
        self.slot_keys = list(_flat(slots))
        # each slot's value as a place in [*modules, *tensors, None] (identity is compared there, nothing held)
        place = {id(m): i for i, m in enumerate(mods)}
        place.update((id(t), len(mods) + i) for i, t in enumerate(uniq))
        place[id(None)] = len(mods) + len(uniq)
        self.slot_ids = [place[id(v)] for v in _flat(map(_values, slots))]
        self.trefs = [weakref.ref(t) for t in uniq]
        self.ttypes = [type(t) for t in uniq]
        self.objs, self.otypes = objs, list(map(type, objs))
        self.owners = [o for o in objs if type(o) is not dict and kind(o) == OBJ]
        self.odicts = list(map(instance_dict, self.owners))
        self.views = views
        self.flat = list(_flat(views))
        self.paths = [p for p, _ in w.modules]
        self.typeset = set(w.types)
        self.rows = [(e.path, e.role, tindex[id(e.tensor)], index[id(e.module)], e.key, e.slot, e.module_path,
                      e.moved_by_module_to, e.alias_of) for e in entries]
        return self

    def read(self, root: nn.Module) -> Walk | None:
        """The walk of ``root`` made from what was kept, or None where anything it read may differ."""
        if self.root() is not root:
            return None
        live = list(map(_deref, self.refs))
        # compared by class, never with ``in``: that would call a tensor's or a module's ``__eq__``; a dead
        # reference reads as NoneType there
        if list(map(type, live)) != self.types:
            return None
        ds = list(map(_dict, live))
        if list(_flat(ds)) != self.keys or any(map(dict.get, ds, ("_forward_hooks",) * len(ds))):
            return None
        vals = list(map(dict.__getitem__, map(ds.__getitem__, self.at_mod), self.at_key))
        if list(map(type, vals)) != self.vtypes:
            return None
        if not all(map(is_, self.held_of(vals), self.held)):
            return None
        ts = list(map(_deref, self.trefs))
        if list(map(type, ts)) != self.ttypes:
            return None
        slots = self.slots_of(vals)
        if list(_flat(slots)) != self.slot_keys:
            return None
        pool = live + ts
        pool.append(None)
        now = list(_flat(map(_values, slots)))
        if len(now) != len(self.slot_ids) or not all(map(is_, now, map(pool.__getitem__, self.slot_ids))):
            return None
        if not FAST_ATOMS.issuperset(map(type, _flat(map(_values, map(_dict, ts))))):
            return None
        if list(map(type, self.objs)) != self.otypes or not all(map(is_, map(instance_dict, self.owners),
                                                                       self.odicts)):
            return None
        flat = list(_flat(self.views))
        if len(flat) != len(self.flat) or not all(map(is_, flat, self.flat)):
            return None
        w = Walk()
        w.modules = list(zip(self.paths, live))  # type: ignore[arg-type]  # alive: their types matched
        w.roots = [(self.root_path, root)]
        w.types = self.typeset.copy()
        new = object.__new__
        out = w.entries
        for path, role, ti, mi, key, slot, mpath, moved, alias in self.rows:
            e = new(Entry)
            e.path = path
            e.role = role
            e.tensor = ts[ti]
            e.owner = e.module = live[mi]
            e.key = key
            e.slot = slot
            e.module_path = mpath
            e.moved_by_module_to = moved
            e.alias_of = alias
            e._info = None
            out.append(e)
        return w
