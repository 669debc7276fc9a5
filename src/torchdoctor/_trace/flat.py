"""The lean read of a module tree as flat lists, compared at C speed.

``snapshot.Shape`` re-reads a tree slot by slot in a Python loop over its modules (~1 ms for 160 modules). A
``Flat`` is primed from one such read and holds, flat across all modules in the walker's order: each module's
``__dict__`` length and keys in order; the type of each value the slow read reads (the three slot dicts and the
attributes; never the hook dicts: after a big cast each object touched is a cache miss); the children's names
and identities; the parameter and buffer slot names and value types; where the tensors and the attribute
objects sit in those lists; and the path and scope of every tensor. A read builds the same lists from the live
tree with ``map`` and ``chain`` and compares them with list equality. When all are equal the tree has the shape
the slow read walked: no key was added or removed, and every slot holds what it held or another tensor of the
same exact type (read as the slow read reads it, so a slot write, ``swap_tensors`` or ``.data =`` is seen). The
snapshot is then ``zip`` of the cached paths with the tensors now in those slots. Anything unequal (a key, a
value's type, a child, a tied weight) returns None: the slow read decides and primes again.

Attribute objects (a config) and the non-plain values of a tensor's ``__dict__`` must hold no tensor, as in the
slow read: ``inert`` proves it, and a ``Proof`` keeps what that read (every container and what it held, by
identity) to prove it again at C speed while nothing in them changed; a change anywhere in them proves anew.

Nothing here holds a tensor, a module or a module's ``__dict__``: modules are held by weak reference, values by
type, children by ``id`` (compared while the modules holding those ids are alive, so no id is reused). A proof
holds the attribute objects' contents, none of which is a tensor or a module.
"""

from __future__ import annotations

import weakref
from itertools import chain
from operator import attrgetter, is_
from typing import Any

import torch
from torch import nn

from torchdoctor._walk.kinds import ATOM, FAST_ATOMS, FUNC, HOOK, MAPPING, OBJ, SEQ, SET, SKIP, has_members, \
    instance_dict, kind

_T, _P = torch.Tensor, nn.Parameter
_NONE = type(None)
_deref = weakref.ref.__call__
_dict = attrgetter("__dict__")
_device = attrgetter("device")
_dtype = attrgetter("dtype")
_values = dict.values
_flat = chain.from_iterable

_OWNER = object()  # marks an object and its __dict__ in a trail
_INERT_LIMIT = 20_000  # objects looked at; beyond, the walker decides


def inert(objs: list[Any], trail: list[Any] | None = None) -> bool:
    """True when nothing the walker would reach from ``objs`` is a tensor, a module or something it reads in its
    own way (a closure, a partial, a slotted object): such objects add nothing to a walk. Read as the walker reads
    (builtin methods of dicts, lists, sets; instance ``__dict__``), without its per-value bookkeeping (a
    transformers config is ~200 values: walking them was half of a lean read); False whenever unsure.

    ``trail`` (a list) collects what ``Proof`` needs to prove it again by identity: the containers read, and
    for each object its ``__dict__``; a None in it means something was read that identity cannot vouch for."""
    stack = objs
    seen: set[int] = set()
    atoms = FAST_ATOMS
    while stack:
        v = stack.pop()
        if type(v) in atoms:
            continue
        k = kind(v)
        if k == ATOM or k == SKIP or k == HOOK:
            continue
        if k == FUNC and not has_members(v, k):
            if trail is not None:
                trail.append(None)  # a function can gain members later: not vouched for by its identity
            continue
        if id(v) in seen:
            continue
        seen.add(id(v))
        if len(seen) > _INERT_LIMIT:
            return False
        if k == MAPPING:
            stack.extend(dict.values(v))
            n = len(stack)
            stack.extend(key for key in dict.keys(v) if type(key) not in atoms)
            if trail is not None:
                trail.append(dict.values(v) if len(stack) == n else None)
        elif k == SEQ:
            stack.extend(list.__iter__(v) if isinstance(v, list) else tuple.__iter__(v))
            if trail is not None:
                trail.append(v if type(v) is list or type(v) is tuple else None)
        elif k == SET:
            stack.extend(set.__iter__(v) if isinstance(v, set) else frozenset.__iter__(v))
            if trail is not None:
                trail.append(v if type(v) is set or type(v) is frozenset else None)
        elif k == OBJ and not hasattr(type(v), "__slots__"):
            d = instance_dict(v)
            if d:
                stack.extend(d.values())
            if trail is not None:
                trail.append((_OWNER, v, d))
        else:  # tensors, modules, closures, partials, deques, slotted objects
            return False
    return True


class Proof:
    """That ``inert(roots)`` held, kept as what it read: proved again when the same roots hold the same
    objects in the same containers (compared by identity at C speed; the objects are held meanwhile, and
    none is a tensor or a module, or the proof would not exist)."""

    __slots__ = ("roots", "owners", "dicts", "views", "held")
    roots: list[Any]
    owners: list[Any]
    dicts: list[dict[str, Any] | None]
    views: list[Any]
    held: list[Any]

    @classmethod
    def of(cls, roots: list[Any]) -> tuple[bool, Proof | None]:
        """``inert(roots)``, and its proof when identity can vouch for it."""
        trail: list[Any] = []
        if not inert(list(roots), trail):
            return False, None
        if None in trail:
            return True, None
        self = cls()
        self.roots = list(roots)
        owned = [x for x in trail if type(x) is tuple and len(x) == 3 and x[0] is _OWNER]
        self.owners = [x[1] for x in owned]
        self.dicts = [x[2] for x in owned]
        self.views = [x for x in trail if not (type(x) is tuple and len(x) == 3 and x[0] is _OWNER)]
        self.views += [dict.values(d) for d in self.dicts if d is not None]  # empty ones too: they may fill
        self.held = list(_flat(self.views))
        return True, self

    def holds(self, roots: list[Any]) -> bool:
        return (len(roots) == len(self.roots) and all(map(is_, roots, self.roots))
                and all(map(is_, map(instance_dict, self.owners), self.dicts))
                and _same(list(_flat(self.views)), self.held))


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(map(is_, a, b))


class Flat:
    """One lean read's shape as flat lists (see the module docstring)."""

    __slots__ = ("refs", "lens", "keys", "at_mod", "at_key", "types", "slot_at", "slot_lens", "slot_names", "kids",
                 "kid_ids", "slot_types", "keep", "attr_at", "other_at", "paths", "scopes", "proof")
    refs: list[Any]
    lens: list[int]
    keys: list[str]
    at_mod: list[int]
    at_key: list[str]
    types: list[type]
    slot_at: list[int]  # where in the values read the slot dicts are: every _modules, then _parameters, _buffers
    slot_lens: list[int]
    slot_names: list[str]  # flat, in that order
    kids: int  # how many of the slots' values are children (they come first)
    kid_ids: list[int]
    slot_types: list[type]  # the types of the parameter and buffer slots' values
    keep: list[int]  # where in the slots' values the tensors are (the None slots left out)
    attr_at: list[int]
    other_at: list[int]
    paths: list[str]
    scopes: list[Any]
    proof: Proof | None

    @classmethod
    def prime(cls, mods: list[tuple[Any, ...]], snap: dict[str, Any], objects: dict[int, Any]) -> Flat | None:
        """The flat shape of the tree ``snapshot.Shape.mods`` describes, checked against the slow read's result
        ``snap``/``objects`` made just now; None when a flat read could not make the same snapshot."""
        self = cls()
        self.proof = None
        self.refs = [m[0] for m in mods]
        live = list(map(_deref, self.refs))
        if None in live:
            return None
        ds = list(map(_dict, live))
        self.lens = list(map(len, ds))
        self.keys = list(_flat(ds))
        # the values read, by (module, key): the slot dicts and the attributes, never the hook dicts (a read
        # that touched every value of every module's __dict__ paid a cache miss for each after a big cast)
        self.at_mod, self.at_key = [], []
        sub_at: list[int] = []
        par_at: list[int] = []
        buf_at: list[int] = []
        self.attr_at, self.other_at = [], []
        for i, ((_, _, _, akeys, *_), d) in enumerate(zip(mods, ds)):
            for key, into in (("_modules", sub_at), ("_parameters", par_at), ("_buffers", buf_at)):
                into.append(len(self.at_key))
                self.at_mod.append(i)
                self.at_key.append(key)
            for key, _path in akeys:  # sorted keys: the slow read's (and the walker's) order
                tv = type(d[key])
                if tv is _T or tv is _P:
                    self.attr_at.append(len(self.at_key))
                elif tv not in FAST_ATOMS:
                    self.other_at.append(len(self.at_key))
                self.at_mod.append(i)
                self.at_key.append(key)
        vals = list(map(dict.__getitem__, map(ds.__getitem__, self.at_mod), self.at_key))
        self.types = list(map(type, vals))
        # the three kinds of slot dict read as one: fewer, longer lists (each list made costs as much as ~30 items)
        self.slot_at = sub_at + par_at + buf_at
        sd = list(map(vals.__getitem__, self.slot_at))
        self.slot_lens = list(map(len, sd))
        self.slot_names = list(_flat(sd))
        flat = list(_flat(map(_values, sd)))
        self.kids = sum(self.slot_lens[:len(sub_at)])
        self.kid_ids = list(map(id, flat[:self.kids]))
        self.slot_types = list(map(type, flat[self.kids:]))
        if not set(self.slot_types) <= {_T, _P, _NONE}:
            return None
        self.keep = [i for i in range(self.kids, len(flat)) if flat[i] is not None]  # parameters, then buffers
        tensors = list(map(flat.__getitem__, self.keep)) + [vals[i] for i in self.attr_at]
        ids = list(map(id, tensors))
        if len(set(ids)) != len(ids) or len(snap) != len(tensors):
            return None  # a tied weight: the slow read keeps its first path
        if not all(v[0] is t for v, t in zip(snap.values(), tensors)):
            return None
        self.paths = list(snap)
        self.scopes = [objects[i] for i in ids]
        others = self._others(tensors, vals)
        if others:  # proved now, with the walk it is primed from: a trace's first call then proves by identity
            ok, self.proof = Proof.of(others)
            if not ok:
                return None
        return self

    def _others(self, tensors: list[Any], vals: list[Any]) -> list[Any]:
        """The objects a read must prove tensor-free: the non-atom values of the tensors' own ``__dict__``
        (quant_state hangs there) and the attribute objects (a config)."""
        extra = list(_flat(map(_values, map(_dict, tensors))))  # quant_state hangs here; buffers' flags
        others = [v for v in extra if type(v) not in FAST_ATOMS] if not FAST_ATOMS.issuperset(map(type, extra)) else []
        others += map(vals.__getitem__, self.other_at)
        return others

    def read(self, base: dict[int, Any], modules: dict[str, Any]) -> tuple[dict[str, Any], dict[int, Any], dict[str, Any]] | None:
        """The slow read's result now (``base``: the modules' objects), or None when the tree changed shape."""
        live = list(map(_deref, self.refs))
        if None in live:
            return None
        ds = list(map(_dict, live))  # held until the end: the children's ids stay theirs meanwhile
        if list(map(len, ds)) != self.lens or list(_flat(ds)) != self.keys:
            return None  # equal lengths and keys in order: no key was added, removed or re-added
        vals = list(map(dict.__getitem__, map(ds.__getitem__, self.at_mod), self.at_key))
        if list(map(type, vals)) != self.types:
            return None
        sd = list(map(vals.__getitem__, self.slot_at))
        if list(map(len, sd)) != self.slot_lens or list(_flat(sd)) != self.slot_names:
            return None
        flat = list(_flat(map(_values, sd)))
        n = self.kids
        if list(map(id, flat[:n])) != self.kid_ids or list(map(type, flat[n:])) != self.slot_types:
            return None
        tensors = list(map(flat.__getitem__, self.keep))
        tensors += map(vals.__getitem__, self.attr_at)
        ids = list(map(id, tensors))
        if len(set(ids)) != len(ids):
            return None
        others = self._others(tensors, vals)
        if others:  # the attribute objects (a config) hold no tensor: proved as last time, or proved again
            proof = self.proof
            if proof is None or not proof.holds(others):
                ok, self.proof = Proof.of(others)
                if not ok:
                    return None
        snap = dict(zip(self.paths, zip(tensors, ids, map(_device, tensors), map(_dtype, tensors))))
        objects = dict(base)
        objects.update(zip(ids, self.scopes))
        if len(objects) != len(base) + len(ids):
            return None
        return snap, objects, dict(modules)
