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
from operator import attrgetter
from typing import Any

import torch
from torch import nn

from torchdoctor._walk.entry import Entry, Walk, join_path, offloaded, set_tensor
from torchdoctor._walk.kinds import (FAST_ATOMS, MAPPING, MEMBER_KINDS, NO_KEYS, OBJ, SCRIPTED, SEQ, SET, atoms_only,
                                     class_keys, form_of, group_offloading, hook_chain, is_quant_type, is_script, kind,
                                     script_dict)
from torchdoctor._walk.values import EMPTY, MAX_DEPTH, MAX_ITEMS, MAX_NODES, Values

_FORWARD: Any = object()  # in expand's ``later`` list: the module's own ``forward`` attribute, not a key
_UNSEEN: Any = object()
_ATOMS_GE = FAST_ATOMS.issuperset
_TENSOR_OF = attrgetter("tensor")
_SEQ_SETS = frozenset({tuple, list, set, frozenset})  # exact types: their own length and iteration run no user code
# class -> the key-set record its last module matched, across walks: a walk's first module of each class reads it
# here instead of calling ``class_keys`` (a dozen classes a model, ~0.4 us each, on every scan)
_LAST_KEYS: dict[type, Any] = {}
__all__ = ["MAX_DEPTH", "MAX_ITEMS", "MAX_NODES", "Entry", "Walk", "form_of", "hook_chain", "is_quant_type", "set_tensor", "walk"]


class _Walker(Values):
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
        self.classes: dict[type, Any] = {}  # class -> its key set and what follows (``kinds.class_keys``)

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
        module_set, modules = self.module_set, self.w.modules
        hooked, max_nodes = self.w.hooked, MAX_NODES
        nodes = self.nodes
        tensor, param, module_type, new = torch.Tensor, nn.Parameter, nn.Module, object.__new__
        atoms, hooks, batch, done = FAST_ATOMS, self.w.hooks, self.batch, self.attrs_done
        classes, scripted = self.classes, SCRIPTED  # this walk's classes -> their key sets; TorchScript classes
        last_keys = _LAST_KEYS
        pop, push, add_later = stack.pop, stack.append, later.append
        att_p, att_b = attach
        while stack:
            path, mod, depth = pop()
            nodes += 1
            if nodes > max_nodes:
                self.truncate(path, f"more than {MAX_NODES} module paths")
                break
            mid = id(mod)
            d = mod.__dict__
            if mid not in module_set:
                module_set[mid] = batch
                modules.append((path, mod))
                first = fresh = True
            else:  # reached again: its attributes once per batch (at the first path)
                first = False
                fresh = module_set[mid] != batch and done.get(mid) != batch
                done[mid] = batch
            if fresh:
                # a class's modules nearly always have one key set, inserted in one order: comparing the keys in
                # order with the class's last ones is a quarter of the cost of a set difference and a sort (tuples
                # of the same interned names compare by identity). The keys known, the module's dicts are read by
                # subscript (no method call).
                tp = type(mod)
                hit: Any = classes.get(tp)
                if hit is None:  # the class's record from the walks before (a dict read, not a class_keys call)
                    hit = classes[tp] = last_keys.get(tp) or NO_KEYS
                if tuple(d) != hit[5]:
                    hit = classes[tp] = last_keys[tp] = class_keys(tp, d)
                if first and hit[6] and d["_forward_hooks"] and d["_forward_pre_hooks"]:
                    hooked.append((path, mod))  # hooked on both sides, at its first path
                simple = hit[11]  # nearly every class: its three dicts, nothing of what follows
                if simple:
                    ps, bs, sub, compiled = d["_parameters"], d["_buffers"], d["_modules"], False
                else:
                    if hit[4]:  # TorchScript: C++-backed wrappers in __dict__ (a traced model's top: none)
                        d = script_dict(mod)
                    ps = d["_parameters"] if hit[7] else None
                    bs = d["_buffers"] if hit[8] else None
                    sub = d["_modules"] if hit[9] else None
                    compiled = hit[10]
            else:
                if scripted.get(type(mod)) is not False and is_script(type(mod)):
                    d = script_dict(mod)
                ps, bs, sub = d.get("_parameters"), d.get("_buffers"), d.get("_modules")
                compiled = type(mod).__name__ == "OptimizedModule"
            try:  # one join per module, not one per tensor and child
                prefix = path + "." if path else ""
            except TypeError:  # a path that is not a string (a key set through __dict__): joined as it was
                prefix = None
            if ps:  # parameters, then buffers: the canonical order
                for name, t in dict.items(ps):
                    tp = type(t)
                    plain = tp is param or tp is tensor
                    if plain or isinstance(t, tensor):
                        p = prefix + name if prefix is not None and type(name) is str else \
                            f"{path}.{name}" if path else name
                        if plain or self.readable(t, p, "parameter"):
                            e = new(Entry)  # new_entry inlined: one call frame less per tensor
                            e.path = p
                            e.role = "parameter"
                            e.tensor = t
                            e.owner = e.module = mod
                            e.key = name
                            e.slot = "param"
                            e.module_path = path
                            e.moved_by_module_to = moved
                            e.alias_of = None
                            e._info = None
                            params.append(e)
                            if not plain or (td := t.__dict__) and not _ATOMS_GE(map(type, td.values())):
                                att_p.append(e)  # attributes of its own (weight.quant_state, GPTQ's), not flags only
            if bs:
                self.tensors(bs, prefix, path, mod, moved, buffers, att_b)
            # module attributes (plain tensors, objects, containers, list-held modules: never moved by Module.to),
            # once per batch for a module reached twice, at its first path
            if fresh:
                if simple:
                    pass
                elif hit[2]:
                    if "_hf_hook" in d:
                        hooks.append((path, mod, d["_hf_hook"]))
                    if group_offloading(d.get("_diffusers_hook")):
                        hooks.append((path, mod, d["_diffusers_hook"]))
                if not simple and hit[3] and d["forward"] is not None:
                    add_later((path, mod, _FORWARD, d["forward"]))
                for key in hit[1]:
                    v = d[key]
                    tv = type(v)
                    if tv in atoms:
                        continue
                    if nodes < max_nodes and (tv in _SEQ_SETS and (not v or len(v) <= MAX_ITEMS and _ATOMS_GE(map(
                            type, v))) or tv is dict and (not v or atoms_only(v, MAPPING, MAX_ITEMS))):
                        # a conv's kernel_size, stride and padding, an empty key list, a transformers model's plans
                        # and sets of names: plain values or none, nothing to record for a second visit, which
                        # proves it again as cheaply (counted as ``value`` would)
                        nodes += 1
                        continue
                    add_later((path, mod, key, v))
            if not sub:
                continue
            del ancestors[depth:]
            ancestors.append(mid)
            depth += 1
            if prefix is not None and not compiled:
                for name, child in reversed(dict.items(sub)):
                    if isinstance(child, module_type) and (id(child) not in module_set or id(child) not in ancestors):
                        push((prefix + name if type(name) is str else f"{path}.{name}" if path else name, child, depth))
                continue
            for name, child in reversed(dict.items(sub)):  # torch.compile's wrapper: its paths are the model's
                if isinstance(child, module_type) and (id(child) not in module_set or id(child) not in ancestors):
                    push((path if compiled and name == "_orig_mod" else prefix + name if prefix is not None and
                          type(name) is str else f"{path}.{name}" if path else name, child, depth))
        self.nodes = nodes

    def tensors(self, bs: dict[str, Any], prefix: str | None, path: str, mod: nn.Module, moved: bool,
                out: list[Entry], att: list[Entry]) -> None:
        """A module's buffers as entries (its parameters are read in ``expand``'s own loop: most modules hold some)."""
        for name, t in dict.items(bs):
            tp = type(t)
            plain = tp is nn.Parameter or tp is torch.Tensor
            if plain or isinstance(t, torch.Tensor):
                p = prefix + name if prefix is not None and type(name) is str else f"{path}.{name}" if path else name
                if plain or self.readable(t, p, "buffer"):
                    e = Entry(p, "buffer", t, mod, name, "buffer", mod, path, moved)
                    out.append(e)
                    # a plain tensor whose attributes are all plain values (transformers' ``_is_buffer`` and
                    # ``persistent`` flags) has nothing for ``attached`` to find
                    if not plain or (td := t.__dict__) and not _ATOMS_GE(map(type, td.values())):
                        att.append(e)

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
                    seen[id(v)] = EMPTY
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



def walk(obj: Any) -> Walk:
    """Every tensor reachable from ``obj`` (module, pipeline-like object, dict/list/tuple/dataclass).

    >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2))
    >>> m.extra = torch.zeros(3)
    >>> [(e.path, e.role) for e in walk(m).entries]
    [('0.weight', 'parameter'), ('0.bias', 'parameter'), ('extra', 'attribute')]
    """
    if len(_LAST_KEYS) > 4096:  # fx GraphModules make a class per instance
        _LAST_KEYS.clear()
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
    if wk.w.hooks:  # accelerate's offload hooks: their weights_map copies
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
