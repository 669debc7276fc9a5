"""The walker's reading of everything that is not a module tree: tensors' attached attributes (``quant_state``,
subclass inners), module attributes, containers and plain objects (``Values``, the base of the walker), and the
walk's bounds. Reads ``__dict__``, slots and builtin containers through the builtin types' own methods only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from torchdoctor._report.model import Problem
from torchdoctor._walk.entry import Entry, Walk, join_path
from torchdoctor._walk.kinds import (ATOM, FAST_ATOMS, FUNC, HOOK, MAPPING, MEMBER_KINDS, MODULE, OBJ, PLAIN, SEQ, SET,
                                     SKIP, TENSOR, atoms_only, has_members, inner_value, instance_dict, is_jagged_type,
                                     is_quant_type, kind, members, slot_items, unreadable)

MAX_DEPTH = 64  # nesting of plain objects / containers below a module attribute
MAX_ITEMS = 100_000  # items read from one container
MAX_NODES = 5_000_000  # objects visited in one walk
_ATOMS_GE = FAST_ATOMS.issuperset
# the record of an object walked that held no tensor: (first path, list, start, end) with an empty range, shared
# (its path names no alias, so none is made per object)
EMPTY: tuple[str, list[Entry], int, int] = ("", [], 0, 0)
_CONTAINERS: dict[type, int] = {dict: MAPPING, list: SEQ, tuple: SEQ, set: SET, frozenset: SET}  # exact builtin types: their kinds
# plain object class -> (a quantization library's, has ``__slots__``): a config or a scheduler is met on every walk
_OBJ_FACTS: dict[type, tuple[bool, bool]] = {}


def _obj_facts(tp: type) -> tuple[bool, bool]:
    if len(_OBJ_FACTS) > 4096:  # classes made per instance
        _OBJ_FACTS.clear()
    facts = _OBJ_FACTS[tp] = (is_quant_type(tp), hasattr(tp, "__slots__"))
    return facts


class Values:
    """The walker's state that attributes and containers share with the module tree, and their reading."""

    w: Walk
    nodes: int
    seen_obj: dict[int, tuple[str, list[Entry], int, int] | None]  # id -> (path, list, start, end)
    keep_alive: list[Any]
    pending: list[tuple[str, nn.Module, bool]]
    module_set: dict[int, int]
    pending_ids: set[int]
    out: list[Entry]


    # -- bounds ---------------------------------------------------------------------------------------
    def truncate(self, path: str, why: str) -> None:
        if len(self.w.problems) < 100:
            self.w.problems.append(Problem("truncated", path or "<root>", "container", why, "", f"walk stopped here: {why}"))

    def readable(self, t: torch.Tensor, path: str, role: str) -> bool:
        """A tensor of an unusual class whose device, dtype or shape raise is reported here and handed to no verb."""
        why = unreadable(t)
        if why is None:
            return True
        if len(self.w.problems) < 1000:
            self.w.problems.append(Problem(
                "unsupported", path or "<root>", role, type(t).__name__, "",
                f"{path or 'the object'} is a {type(t).__module__}.{type(t).__qualname__} whose device, dtype or shape "
                f"cannot be read ({why}): it is not checked"))
        return False


    # -- tensors --------------------------------------------------------------------------------------
    def attached(self, t: torch.Tensor, path: str, module: nn.Module | None, mpath: str, moved: bool, depth: int) -> None:
        tp = type(t)
        if tp is torch.Tensor or tp is nn.Parameter:
            d = instance_dict(t)
            if not d:
                return
        if depth > 8 or is_jagged_type(tp):  # a jagged nested tensor is one tensor: its parts are internals
            return
        quant = is_quant_type(tp)
        role = "quant_state" if quant else "attribute"
        custom_to = quant and "to" in tp.__dict__
        names: list[str] = []
        flatten = getattr(tp, "__tensor_flatten__", None)
        if flatten is not None and tp not in PLAIN:
            try:
                names = list(flatten(t)[0])  # the subclass protocol, side-effect free by contract
            except Exception:
                names = []
            inner_role = "quant_state" if quant else "subclass_inner"
            for n in names:
                inner = inner_value(t, n)  # __dict__ or a slot (DTensor._local_tensor)
                if isinstance(inner, torch.Tensor):
                    p = join_path(path, n)
                    if type(inner) in PLAIN or self.readable(inner, p, inner_role):
                        self.out.append(Entry(p, inner_role, inner, t, n, "inner", module, mpath, moved))
                        self.attached(inner, p, module, mpath, moved, depth + 1)
        d = instance_dict(t)
        if d:
            for key in d:
                if key in names or type(d[key]) in FAST_ATOMS:  # value() returns at once for these (a buffer's flags)
                    continue
                self.value(d[key], join_path(path, key), t, key, "attr", module, mpath, role, depth + 1,
                           moved=custom_to)

    # -- everything else ------------------------------------------------------------------------------
    def value(self, v: Any, path: str, owner: Any, key: Any, slot: str, module: nn.Module | None, mpath: str,
              role: str, depth: int, moved: bool = False) -> None:
        k = kind(v)
        if k == ATOM or k == SKIP:
            return
        self.nodes += 1
        if self.nodes > MAX_NODES:
            if self.nodes == MAX_NODES + 1:
                self.truncate(path, f"more than {MAX_NODES} objects visited")
            return
        if k == TENSOR:
            if type(v) in PLAIN or self.readable(v, path, role):
                self.out.append(Entry(path, role, v, owner, key, slot, module, mpath, moved))
                self.attached(v, path, module, mpath, moved, depth + 1)
            return
        if k == MODULE:
            if id(v) not in self.module_set and id(v) not in self.pending_ids:
                # reached outside any _modules tree (plain list/dict/attribute): Module.to of the parent skips it
                self.pending_ids.add(id(v))
                self.pending.append((path, v, module is None))
                if module is None and slot == "attr":  # a component a plain object holds (an app's patcher)
                    self.w.holders[path] = owner
            return
        if k == HOOK or (k == FUNC and not has_members(v, k)):
            return
        if depth >= MAX_DEPTH:
            self.truncate(path, f"nesting deeper than {MAX_DEPTH}")
            return
        oid = id(v)
        if oid in self.seen_obj:
            rec = self.seen_obj[oid]
            if rec is not None:  # already walked: its tensors are aliases here
                old, lst, start, end = rec
                for e in lst[start:end]:
                    if e.path.startswith(old):
                        self.out.append(Entry(path + e.path[len(old):], e.role, e.tensor, e.owner, e.key, e.slot,
                                             e.module, e.module_path, e.moved_by_module_to))
            return
        self.seen_obj[oid] = None
        self.keep_alive.append(v)
        lst, start = self.out, len(self.out)
        if (k == MAPPING or k == SEQ or k == SET) and atoms_only(v, k, MAX_ITEMS):
            self.seen_obj[oid] = EMPTY  # walked: it holds no tensor
            return
        if k == OBJ:
            facts = _OBJ_FACTS.get(type(v)) or _obj_facts(type(v))
            if facts[0]:
                role = "quant_state"
        child_role = role if role == "quant_state" else "container"
        if k in MEMBER_KINDS:  # set, frozenset, deque, functools.partial, closures: each child has its own slot
            for i, (ck, cv, cslot, cowner) in enumerate(members(v, k)):
                if i >= MAX_ITEMS:
                    self.truncate(path, f"more than {MAX_ITEMS} items in one container")
                    break
                self.value(cv, join_path(path, ck), cowner, ck, cslot, module, mpath, child_role, depth + 1, moved)
            self.seen_obj[oid] = (path, lst, start, len(lst))
            return
        if k == MAPPING:
            items: Any = dict.items(v)
        elif k == SEQ:
            fields = getattr(type(v), "_fields", None)
            seq = list.__iter__(v) if isinstance(v, list) else tuple.__iter__(v)
            items = zip(fields, seq) if isinstance(fields, tuple) else enumerate(seq)
        else:
            d = instance_dict(v)
            if d and len(d) <= MAX_ITEMS and not facts[1]:
                # an object's plain values (most of a config's) are skipped by the loop below: left out by one
                # comprehension (half the cost of a chain of maps under ``compress``), after one C-speed
                # pass that proves the common case of none left (a generation config)
                atoms = FAST_ATOMS
                items = () if _ATOMS_GE(map(type, d.values())) else [(ck, cv) for ck, cv in dict.items(d)
                                                                     if type(cv) not in atoms]
            else:
                items = list(d.items()) if d else []
                if facts[1]:
                    items.extend(slot_items(v))
            child_role = "quant_state" if role == "quant_state" else "attribute"
        cslot = "item" if k == MAPPING or k == SEQ else "attr"
        atoms, containers, seen, deep_ok = FAST_ATOMS, _CONTAINERS, self.seen_obj, depth + 1 < MAX_DEPTH
        for i, (ck, cv) in enumerate(items):
            if i >= MAX_ITEMS:
                self.truncate(path, f"more than {MAX_ITEMS} items in one container")
                break
            name: Any = ck
            if k == MAPPING and type(ck) not in atoms:  # tensors and modules used as dict keys
                self.value(ck, join_path(path, f"<key {i}>"), v, ck, "key", module, mpath, child_role, depth + 1, moved)
                if not isinstance(ck, (str, int, tuple)):  # one path per value (optimizer state keyed by parameters)
                    name = f"<{type(ck).__name__} {i}>"
            if type(cv) not in atoms:  # value() returns at once for these: a config's ints and strings
                ck_kind = containers.get(type(cv))
                if ck_kind is not None and deep_ok and self.nodes < MAX_NODES and id(cv) not in seen and \
                        atoms_only(cv, ck_kind, MAX_ITEMS):
                    # a config's label maps and rope parameters: recorded here as ``value`` would record them
                    self.nodes += 1
                    seen[id(cv)] = EMPTY
                    self.keep_alive.append(cv)
                    continue
                self.value(cv, join_path(path, name), v, ck, cslot, module, mpath, child_role, depth + 1, moved)
        self.seen_obj[oid] = (path, lst, start, len(lst))
