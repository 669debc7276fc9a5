"""The walker: every tensor reachable from an object, with the dotted path a user would type.

One walker serves every verb. It never runs user code: it reads ``__dict__`` and slots, iterates dicts, lists,
sets, deques, ``functools.partial`` arguments and closure cells through the builtin types' own methods, tracks
visits by ``id()`` and skips Python modules, classes, methods and descriptors, so properties, ``__getattr__``,
``__iter__``, ``__eq__`` and ``__hash__`` of user types are never called. Every tensor form is one entry (a nested
tensor with its internals hidden, a sparse, quantized or distributed tensor); a tensor whose device or dtype
cannot be read is an ``unsupported`` problem at its path.
Canonical order: parameters, buffers, tensor-attached attributes (``weight.quant_state.*``), module attributes,
then containers; a tensor reached again is an alias of its first path.
"""

from __future__ import annotations

import types
from itertools import compress
from operator import attrgetter, not_
from typing import Any

import torch
from torch import nn

from torchdoctor._report.model import Problem
from torchdoctor._walk.entry import Entry, Walk, join_path, offloaded, set_tensor
from torchdoctor._walk.kinds import (ATOM, FAST_ATOMS, FUNC, HOOK, MAPPING, MEMBER_KINDS, MODULE, NO_KEYS, OBJ, PLAIN,
                                     SCRIPTED, SEQ, SET, SKIP, TENSOR, atoms_only, class_keys, form_of, group_offloading,
                                     has_members, hook_chain, inner_value, instance_dict, is_jagged_type, is_quant_type,
                                     is_script, kind, members, script_dict, slot_items, unreadable)

MAX_DEPTH = 64  # nesting of plain objects / containers below a module attribute
MAX_ITEMS = 100_000  # items read from one container
MAX_NODES = 5_000_000  # objects visited in one walk

_FORWARD: Any = object()  # in expand's ``later`` list: the module's own ``forward`` attribute, not a key
_UNSEEN: Any = object()
_ATOMS_GE = FAST_ATOMS.issuperset
_TENSOR_OF = attrgetter("tensor")
__all__ = ["MAX_DEPTH", "MAX_ITEMS", "Entry", "Walk", "form_of", "hook_chain", "is_quant_type", "set_tensor", "walk"]


class _Walker:
    def __init__(self) -> None:
        self.w = Walk()
        self.nodes = 0
        self.seen_obj: dict[int, tuple[str, list[Entry], int, int] | None] = {}  # id -> (path, list, start, end)
        self.keep_alive: list[Any] = []  # ids stay valid for the duration of the walk
        self.pending: list[tuple[str, nn.Module, bool]] = []  # module roots to expand: (path, module, moved)
        self.module_set: dict[int, int] = {}  # module id -> the batch that first reached it
        self.pending_ids: set[int] = set()
        self.out: list[Entry] = []
        self.batch = 0  # run_modules' batch: a module's attributes are walked once per batch
        self.attrs_done: dict[int, int] = {}  # module id -> the batch that walked its attributes
        self.classes: dict[type, tuple[frozenset[str], tuple[str, ...], bool, bool, bool, tuple[str, ...]]] = {}

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

    # -- module tree ----------------------------------------------------------------------------------
    def expand(self, root_path: str, root: nn.Module, moved: bool, later: list[tuple[str, nn.Module, Any, Any]],
               params: list[Entry], buffers: list[Entry], attach: tuple[list[Entry], list[Entry]]) -> None:
        """Visit modules in ``named_modules(remove_duplicate=False)`` order, cycles cut, reading parameters and buffers
        (those with attributes of their own go to ``attach``) and, once per batch, the attributes that need walking
        (to ``later``: walked after every parameter and buffer, the canonical order; a ``forward`` set on the
        instance first). One pass: a second loop over the modules cost a sixth of a scan (issue 28)."""
        # depth-first, preorder. A cycle can only lead back to a module already seen, so only those are checked
        # against the ancestors of the current path (kept by depth: no per-module set bookkeeping).
        stack: list[tuple[str, nn.Module, int]] = [(root_path, root, 0)]
        ancestors: list[int] = []
        module_set, modules, module_paths = self.module_set, self.w.modules, self.w.module_paths
        hooked = self.w.hooked
        nodes = self.nodes
        tensor, param, module_type, new = torch.Tensor, nn.Parameter, nn.Module, object.__new__
        atoms, hooks, batch, done = FAST_ATOMS, self.w.hooks, self.batch, self.attrs_done
        classes, scripted = self.classes, SCRIPTED  # this walk's classes -> their key sets; TorchScript classes
        pop, push, add_later = stack.pop, stack.append, later.append
        slots = (("_parameters", "parameter", "param", params, attach[0]), ("_buffers", "buffer", "buffer", buffers,
                                                                              attach[1]))
        while stack:
            path, mod, depth = pop()
            nodes += 1
            if nodes > MAX_NODES:
                self.truncate(path, f"more than {MAX_NODES} module paths")
                break
            mid = id(mod)
            d = mod.__dict__
            if mid not in module_set:
                module_set[mid] = batch
                modules.append((path, mod))
                module_paths[mid] = path
                fresh = True
                if d.get("_forward_hooks") and d.get("_forward_pre_hooks"):  # hooked on both sides, at its first path
                    hooked.append((path, mod))
            else:  # reached again: its attributes once per batch (at the first path)
                fresh = module_set[mid] != batch and done.get(mid) != batch
                done[mid] = batch
            if fresh:
                # a class's modules nearly always have one key set, inserted in one order: comparing the keys in
                # order with the class's last ones is a quarter of the cost of a set difference and a sort (tuples
                # of the same interned names compare by identity)
                hit = classes.get(type(mod)) or NO_KEYS
                if tuple(d) != hit[5]:
                    hit = classes[type(mod)] = class_keys(type(mod), d)
                if hit[4]:  # TorchScript: C++-backed wrappers in __dict__ (a traced model's top: none)
                    d = script_dict(mod)
            elif scripted.get(type(mod)) is not False and is_script(type(mod)):
                d = script_dict(mod)
            try:  # one join per module, not one per tensor and child
                prefix = path + "." if path else ""
            except TypeError:  # a path that is not a string (a key set through __dict__): joined as it was
                prefix = None
            for store, role, slot, out, att in slots:  # parameters, then buffers: the canonical order
                tensors = d.get(store)
                if not tensors:
                    continue
                for name, t in dict.items(tensors):
                    tp = type(t)
                    plain = tp is param or tp is tensor
                    if plain or isinstance(t, tensor):
                        p = prefix + name if prefix is not None and type(name) is str else \
                            f"{path}.{name}" if path else name
                        if plain or self.readable(t, p, role):
                            e = new(Entry)  # new_entry inlined: one call frame less per tensor
                            e.path, e.role, e.tensor, e.owner, e.key, e.slot = p, role, t, mod, name, slot
                            e.module, e.module_path, e.moved_by_module_to, e.alias_of, e._info = \
                                mod, path, moved, None, None
                            out.append(e)
                            if not plain or t.__dict__:  # attributes of its own (weight.quant_state, GPTQ's)
                                att.append(e)
            # module attributes (plain tensors, objects, containers, list-held modules: never moved by Module.to),
            # once per batch for a module reached twice, at its first path
            if fresh:
                if hit[2]:
                    if "_hf_hook" in d:
                        hooks.append((path, mod, d["_hf_hook"]))
                    if group_offloading(d.get("_diffusers_hook")):
                        hooks.append((path, mod, d["_diffusers_hook"]))
                if hit[3] and d["forward"] is not None:
                    add_later((path, mod, _FORWARD, d["forward"]))
                for key in hit[1]:
                    v = d[key]
                    if type(v) not in atoms:
                        add_later((path, mod, key, v))
            sub = d.get("_modules")
            if not sub:
                continue
            del ancestors[depth:]
            ancestors.append(mid)
            depth += 1
            compiled = type(mod).__name__ == "OptimizedModule"  # torch.compile's wrapper: its paths are the model's
            for name, child in reversed(dict.items(sub)):
                if isinstance(child, module_type) and (id(child) not in module_set or id(child) not in ancestors):
                    push((path if compiled and name == "_orig_mod" else prefix + name if prefix is not None and
                          type(name) is str else f"{path}.{name}" if path else name, child, depth))
        self.nodes = nodes

    def run_modules(self) -> None:
        while self.pending:
            batch, self.pending = self.pending, []
            self.batch += 1
            later: list[tuple[str, nn.Module, Any, Any]] = []
            entries = self.w.entries
            buffers: list[Entry] = []
            attach: tuple[list[Entry], list[Entry]] = ([], [])
            for path, mod, moved in batch:
                if id(mod) in self.module_set:
                    continue
                (self.w.roots if moved else self.w.detached).append((path, mod))
                self.expand(path, mod, moved, later, entries, buffers, attach)
            entries.extend(buffers)  # canonical order: every parameter, then every buffer
            # tensor-attached attributes (quant_state, SCB, subclass inners) of what was just found
            for e in attach[0] + attach[1]:
                self.attached(e.tensor, e.path, e.module, e.module_path, e.moved_by_module_to, 0)
            # then the module attributes, in module order (a replaced forward first), keys sorted
            seen = self.seen_obj
            for path, mod, key, v in later:
                if type(v) is tuple and len(v) <= MAX_ITEMS and _ATOMS_GE(map(type, v)) and self.nodes < MAX_NODES:
                    # an exact tuple of plain values (a norm's normalized_shape, several per block): immutable and
                    # holding no tensor, nothing to record for a second visit, which proves it again as cheaply
                    self.nodes += 1
                    continue
                if key is _FORWARD:
                    self.patched_forward(v, path, mod)
                    continue
                # an object walked already that held no tensor (every layer's ``config``): all ``value`` would do
                # is count it, so count it here; so too a container of plain values met first (a transformers
                # model's plans and key lists: a score of them on every root), recorded as ``value`` records it
                rec = seen.get(id(v), _UNSEEN)
                if rec is not _UNSEEN and (rec is None or rec[2] == rec[3]) and self.nodes < MAX_NODES:
                    self.nodes += 1
                    continue
                k = kind(v)
                if rec is _UNSEEN and (k == MAPPING or k == SEQ or k == SET) and self.nodes < MAX_NODES \
                        and atoms_only(v, k, MAX_ITEMS):
                    self.nodes += 1
                    seen[id(v)] = (f"{path}.{key}" if path else key, self.out, len(self.out), len(self.out))
                    self.keep_alive.append(v)
                    continue
                self.value(v, f"{path}.{key}" if path else key, mod, key, "attr", mod, path, "attribute", 0)

    def patched_forward(self, fwd: Any, path: str, mod: nn.Module) -> None:
        """A forward replaced on the instance by a method of another module (kohya sd-scripts' LoRA network:
        ``org_module.forward = lora.forward``, the original kept as ``lora.org_forward``): that module's tensors
        are walked at ``<path>.forward.__self__`` and the patch is recorded."""
        owner = getattr(fwd, "__self__", None) if type(fwd) is types.MethodType else None
        if isinstance(owner, nn.Module) and owner is not mod:
            self.w.patches.append((path, mod, join_path(path, "forward.__self__")))
            self.value(owner, join_path(path, "forward.__self__"), mod, "forward", "attr", mod, path, "attribute", 0)

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
            self.seen_obj[oid] = (path, lst, start, start)  # walked: it holds no tensor
            return
        if k == OBJ and is_quant_type(type(v)):
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
            if d and len(d) <= MAX_ITEMS and not hasattr(type(v), "__slots__"):
                # an object's plain values (most of a config's) are skipped by the loop below: filtered at C speed
                items = list(compress(dict.items(d), map(not_, map(FAST_ATOMS.__contains__, map(type, d.values())))))
            else:
                items = list(d.items()) if d else []
                if hasattr(type(v), "__slots__"):
                    items.extend(slot_items(v))
            child_role = "quant_state" if role == "quant_state" else "attribute"
        cslot = "item" if k == MAPPING or k == SEQ else "attr"
        atoms = FAST_ATOMS
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
                self.value(cv, join_path(path, name), v, ck, cslot, module, mpath, child_role, depth + 1, moved)
        self.seen_obj[oid] = (path, lst, start, len(lst))


def walk(obj: Any) -> Walk:
    """Every tensor reachable from ``obj`` (module, pipeline-like object, dict/list/tuple/dataclass).

    >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2))
    >>> m.extra = torch.zeros(3)
    >>> [(e.path, e.role) for e in walk(m).entries]
    [('0.weight', 'parameter'), ('0.bias', 'parameter'), ('extra', 'attribute')]
    """
    wk = _Walker()
    if isinstance(obj, nn.Module):
        wk.pending.append(("", obj, True))
        wk.out = wk.w.entries
        wk.run_modules()
        rest: list[Entry] = []
    elif isinstance(obj, torch.Tensor):
        wk.out = wk.w.entries
        wk.value(obj, "", None, None, "item", None, "", "container", 0)
        rest = []
    else:
        # a pipeline / dict / object: first find its components (top-level modules), then walk them in order
        rest = []
        wk.out = rest
        k = kind(obj)
        if k in (MAPPING, SEQ, OBJ) or k in MEMBER_KINDS:
            wk.value(obj, "", None, None, "item", None, "", "container" if k != OBJ else "attribute", -1)
            # the root object's own path prefix is empty: strip the leading dot a '' join may not add
        wk.out = wk.w.entries
        wk.run_modules()
    # list-held modules found while walking attributes are expanded by run_modules' loop; tensors found outside
    # module trees come last (containers, scheduler tensors)
    wk.out = wk.w.entries
    wk.run_modules()
    wk.w.entries.extend(rest)
    offloaded(wk.w, wk.w.entries)
    wk.w.types.update(wk.classes)
    entries = wk.w.entries
    if len(set(map(id, map(_TENSOR_OF, entries)))) != len(entries):  # a tensor reached twice: later paths are aliases
        first: dict[int, str] = {}
        for e in entries:
            p = first.setdefault(id(e.tensor), e.path)
            if p != e.path:
                e.alias_of = p
    return wk.w
