"""The walker: every tensor reachable from an object, with the dotted path a user would type.

One walker serves every verb. It never runs user code: it reads ``__dict__`` and slots, iterates
dicts and lists through the builtin methods, tracks visits by ``id()`` and skips Python modules, classes,
functions and descriptors, so properties, ``__getattr__`` and ``__iter__`` of user types are never called.
Canonical order: parameters, buffers, tensor-attached attributes (``weight.quant_state.*``), module attributes,
then containers; a tensor reached again is an alias of its first path.
"""

from __future__ import annotations

import enum
import functools
import types
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from torchdoctor._report.model import Problem, TensorInfo

MAX_DEPTH = 64  # nesting of plain objects / containers below a module attribute
MAX_ITEMS = 100_000  # items read from one container
MAX_NODES = 5_000_000  # objects visited in one walk

# nn.Module bookkeeping: never user data (skipping these by a frozen set is what makes the walk cost about a bare named_parameters() loop).
_MODULE_INTERNALS = frozenset(nn.Module().__dict__) | {"_hf_hook", "_old_forward", "forward", "__dict__"}

_ATOM, _TENSOR, _MODULE, _MAPPING, _SEQ, _SKIP, _OBJ, _HOOK = range(8)
_ATOM_TYPES = (str, bytes, bytearray, int, float, complex, bool, type(None), range, enum.Enum, torch.dtype,
               torch.device, torch.Size, set, frozenset, memoryview, slice)
_SKIP_TYPES = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
               types.LambdaType, functools.partial, property, staticmethod, classmethod, weakref.ref,
               weakref.ProxyType, types.GeneratorType, types.CoroutineType, types.FrameType, types.CodeType,
               types.TracebackType, types.MappingProxyType, types.MethodWrapperType, types.WrapperDescriptorType)
# Objects that hold global or enormous state and never own model tensors.
_SKIP_MODULE_PREFIXES = ("logging", "threading", "multiprocessing", "asyncio", "concurrent", "socket", "ssl", "_io",
                         "io", "typing", "numpy", "tokenizers", "PIL", "queue", "subprocess", "sqlite3", "_thread")
_SKIP_BASE_NAMES = frozenset({"PreTrainedTokenizerBase", "ImageProcessingMixin", "FeatureExtractionMixin",
                              "ProcessorMixin", "Logger", "Handler"})
# Owners whose tensors are quantization metadata (role quant_state).
_QUANT_PREFIXES = ("bitsandbytes", "torchao", "optimum.quanto", "optimum_quanto", "compressed_tensors", "auto_gptq",
                   "gptqmodel", "awq", "hqq", "quanto", "fp8", "transformer_engine")

_KIND_CACHE: dict[type, int] = {}
_ATTR_KEYS: dict[type, tuple[frozenset[str], tuple[str, ...], bool]] = {}  # module class -> (keys, extra, hooked)
_FAST_ATOMS = frozenset({str, int, float, bool, type(None), torch.dtype, torch.device})


def _classify(tp: type) -> int:
    if issubclass(tp, torch.Tensor):
        return _TENSOR
    if issubclass(tp, nn.Module):
        return _MODULE
    if issubclass(tp, _ATOM_TYPES):
        return _ATOM
    if issubclass(tp, _SKIP_TYPES):
        return _SKIP
    if issubclass(tp, dict):
        return _MAPPING
    if issubclass(tp, (list, tuple)):
        return _SEQ
    mod = getattr(tp, "__module__", "") or ""
    if mod.startswith("accelerate.hooks"):
        return _HOOK
    if mod.split(".")[0] in _SKIP_MODULE_PREFIXES or any(b.__name__ in _SKIP_BASE_NAMES for b in tp.__mro__):
        return _SKIP
    return _OBJ


def _kind(obj: Any) -> int:
    tp = type(obj)
    k = _KIND_CACHE.get(tp)
    if k is None:
        k = _KIND_CACHE[tp] = _classify(tp)
    return k


def _is_quant_type(tp: type) -> bool:
    mod = getattr(tp, "__module__", "") or ""
    return mod.startswith(_QUANT_PREFIXES)


def _instance_dict(obj: Any) -> dict[str, Any] | None:
    try:
        d = object.__getattribute__(obj, "__dict__")
    except Exception:
        return None
    return d if type(d) is dict else None


def _slot_items(obj: Any) -> Iterator[tuple[str, Any]]:
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__")
        if not slots:
            continue
        for name in (slots,) if isinstance(slots, str) else slots:
            desc = klass.__dict__.get(name)
            if type(desc) is types.MemberDescriptorType:
                try:
                    yield name, desc.__get__(obj, type(obj))
                except AttributeError:
                    continue


class Entry:
    """One tensor at one path, with what is needed to put a replacement back (``set_tensor``)."""

    __slots__ = ("path", "role", "tensor", "owner", "key", "slot", "module", "module_path", "moved_by_module_to",
                 "alias_of", "_info")

    def __init__(self, path: str, role: str, tensor: torch.Tensor, owner: Any, key: Any, slot: str,
                 module: nn.Module | None, module_path: str, moved: bool) -> None:
        self.path = path
        self.role = role
        self.tensor = tensor
        self.owner = owner
        self.key = key
        self.slot = slot
        self.module = module
        self.module_path = module_path
        self.moved_by_module_to = moved
        self.alias_of: str | None = None
        self._info: TensorInfo | None = None

    def info(self) -> TensorInfo:
        """The entry as a ``TensorInfo`` (computed once; a walk describes one moment)."""
        info = self._info
        if info is None or info.role != self.role:
            t = self.tensor
            try:
                nbytes = t.nbytes  # numel * itemsize, one call
            except Exception:
                nbytes = 0
            info = self._info = TensorInfo(self.path, self.role, t.device, t.dtype, tuple(t.shape), nbytes,
                                           self.moved_by_module_to, self.alias_of)
        return info

    def __repr__(self) -> str:
        return f"Entry({self.path!r}, {self.role}, {self.info().compact})"


class Walk:
    """The result of one walk: ``entries`` in canonical order, ``modules``, ``roots``, ``problems``."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.modules: list[tuple[str, nn.Module]] = []
        self.roots: list[tuple[str, nn.Module]] = []  # components: the root module or top-level modules
        self.detached: list[tuple[str, nn.Module]] = []  # modules held in plain lists/dicts/attributes of modules
        self.problems: list[Problem] = []
        self.module_paths: dict[int, str] = {}
        self.hooks: list[tuple[str, nn.Module, Any]] = []  # (module path, module, accelerate hook)

    @property
    def truncated(self) -> bool:
        return bool(self.problems)

    def canonical(self) -> Iterator[Entry]:
        return (e for e in self.entries if e.alias_of is None)


def _join(prefix: str, key: Any) -> str:
    name = key if isinstance(key, str) else str(key) if isinstance(key, int) else _key_repr(key)
    return f"{prefix}.{name}" if prefix else name


def _key_repr(key: Any) -> str:
    if isinstance(key, (int, float, bool, bytes)) or key is None:
        return str(key)
    if isinstance(key, tuple) and len(key) <= 4 and all(isinstance(k, (str, int)) for k in key):
        return "(" + ",".join(str(k) for k in key) + ")"
    return f"<{type(key).__name__}>"


class _Walker:
    def __init__(self) -> None:
        self.w = Walk()
        self.nodes = 0
        self.seen_obj: dict[int, tuple[str, list[Entry], int, int] | None] = {}  # id -> (path, list, start, end)
        self.keep_alive: list[Any] = []  # ids stay valid for the duration of the walk
        self.pending: list[tuple[str, nn.Module, bool]] = []  # module roots to expand: (path, module, moved)
        self.module_set: set[int] = set()
        self.pending_ids: set[int] = set()
        self.out: list[Entry] = []

    # -- bounds ---------------------------------------------------------------------------------------
    def truncate(self, path: str, why: str) -> None:
        if len(self.w.problems) < 100:
            self.w.problems.append(Problem("truncated", path or "<root>", "container", why, "", f"walk stopped here: {why}"))

    # -- module tree ----------------------------------------------------------------------------------
    def expand(self, root_path: str, root: nn.Module, moved: bool, order: list[tuple[str, nn.Module, bool, Any]]) -> None:
        """Append ``(path, module, moved, __dict__)`` in ``named_modules(remove_duplicate=False)`` order; cycles are
        cut."""
        # depth-first, preorder. A cycle can only lead back to a module already seen, so only those are checked
        # against the ancestors of the current path (kept by depth: no per-module set bookkeeping).
        stack: list[tuple[str, nn.Module, int]] = [(root_path, root, 0)]
        ancestors: list[int] = []
        module_set, modules, module_paths = self.module_set, self.w.modules, self.w.module_paths
        nodes = self.nodes
        while stack:
            path, mod, depth = stack.pop()
            nodes += 1
            if nodes > MAX_NODES:
                self.truncate(path, f"more than {MAX_NODES} module paths")
                break
            mid = id(mod)
            if mid not in module_set:
                module_set.add(mid)
                modules.append((path, mod))
                module_paths[mid] = path
            d = mod.__dict__
            order.append((path, mod, moved, d))
            sub = d.get("_modules")
            if not sub:
                continue
            del ancestors[depth:]
            ancestors.append(mid)
            depth += 1
            for name, child in reversed(dict.items(sub)):
                if isinstance(child, nn.Module) and (id(child) not in module_set or id(child) not in ancestors):
                    stack.append((f"{path}.{name}" if path else name, child, depth))
        self.nodes = nodes

    def run_modules(self) -> None:
        while self.pending:
            batch, self.pending = self.pending, []
            tree: list[tuple[str, nn.Module, bool, Any]] = []
            for path, mod, moved in batch:
                if id(mod) in self.module_set:
                    continue
                (self.w.roots if moved else self.w.detached).append((path, mod))
                self.expand(path, mod, moved, tree)
            entries = self.w.entries
            start = len(entries)
            buffers: list[Entry] = []
            tensor_type = torch.Tensor
            stores = (("_parameters", "parameter", "param", entries), ("_buffers", "buffer", "buffer", buffers))
            for path, mod, moved, d in tree:
                for key, role, kind, sink in stores:
                    tensors = d.get(key)
                    if tensors:
                        for name, t in dict.items(tensors):
                            if isinstance(t, tensor_type):
                                sink.append(Entry(f"{path}.{name}" if path else name, role, t, mod, name, kind,
                                                  mod, path, moved))
            entries.extend(buffers)  # canonical order: every parameter, then every buffer
            # tensor-attached attributes (quant_state, SCB, subclass inners) of what was just found
            plain = (torch.Tensor, nn.Parameter)
            for e in entries[start:]:
                t = e.tensor
                if type(t) in plain and not t.__dict__:
                    continue
                self.attached(t, e.path, e.module, e.module_path, e.moved_by_module_to, 0)
            # module attributes: plain tensors, objects, containers, list-held modules (never moved by Module.to)
            atoms, hooks, attr_keys = _FAST_ATOMS, self.w.hooks, _ATTR_KEYS
            done: set[int] = set()  # a module shared within this batch: its attributes once, at its first path
            for path, mod, _moved, d in tree:
                if id(mod) in done:
                    continue
                done.add(id(mod))
                # modules of one class nearly always have the same __dict__ keys: comparing them with the last
                # key set seen for the class is half the cost of a set difference and a sort per module
                tp = type(mod)
                hit = attr_keys.get(tp)
                if hit is None or d.keys() != hit[0]:
                    if len(attr_keys) > 4096:  # fx GraphModules make a class per instance
                        attr_keys.clear()
                    keys = frozenset(d)
                    hit = attr_keys[tp] = (keys, tuple(sorted(keys - _MODULE_INTERNALS)), "_hf_hook" in keys)
                if hit[2]:
                    hooks.append((path, mod, d["_hf_hook"]))
                for key in hit[1]:
                    v = d[key]
                    if type(v) in atoms:
                        continue
                    self.value(v, f"{path}.{key}" if path else key, mod, key, "attr", mod, path, "attribute", 0)

    # -- tensors --------------------------------------------------------------------------------------
    def attached(self, t: torch.Tensor, path: str, module: nn.Module | None, mpath: str, moved: bool, depth: int) -> None:
        tp = type(t)
        if tp is torch.Tensor or tp is nn.Parameter:
            d = _instance_dict(t)
            if not d:
                return
        if depth > 8:
            return
        quant = _is_quant_type(tp)
        role = "quant_state" if quant else "attribute"
        custom_to = quant and "to" in tp.__dict__
        names: list[str] = []
        flatten = getattr(tp, "__tensor_flatten__", None)
        if flatten is not None and tp not in (torch.Tensor, nn.Parameter):
            try:
                names = list(flatten(t)[0])  # the subclass protocol, side-effect free by contract
            except Exception:
                names = []
            inner_role = "quant_state" if quant else "subclass_inner"
            d = _instance_dict(t) or {}
            for n in names:
                inner = d.get(n)
                if isinstance(inner, torch.Tensor):
                    p = _join(path, n)
                    self.out.append(Entry(p, inner_role, inner, t, n, "inner", module, mpath, moved))
                    self.attached(inner, p, module, mpath, moved, depth + 1)
        d = _instance_dict(t)
        if d:
            for key in d:
                if key in names:
                    continue
                self.value(d[key], _join(path, key), t, key, "attr", module, mpath, role, depth + 1,
                           moved=custom_to)

    # -- everything else ------------------------------------------------------------------------------
    def value(self, v: Any, path: str, owner: Any, key: Any, slot: str, module: nn.Module | None, mpath: str,
              role: str, depth: int, moved: bool = False) -> None:
        k = _kind(v)
        if k == _ATOM or k == _SKIP:
            return
        self.nodes += 1
        if self.nodes > MAX_NODES:
            if self.nodes == MAX_NODES + 1:
                self.truncate(path, f"more than {MAX_NODES} objects visited")
            return
        if k == _TENSOR:
            self.out.append(Entry(path, role, v, owner, key, slot, module, mpath, moved))
            self.attached(v, path, module, mpath, moved, depth + 1)
            return
        if k == _MODULE:
            if id(v) not in self.module_set and id(v) not in self.pending_ids:
                # reached outside any _modules tree (plain list/dict/attribute): Module.to of the parent skips it
                self.pending_ids.add(id(v))
                self.pending.append((path, v, module is None))
            return
        if k == _HOOK:
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
        if k == _OBJ and _is_quant_type(type(v)):
            role = "quant_state"
        if k == _MAPPING:
            items: Any = dict.items(v)
            child_role = role if role == "quant_state" else "container"
        elif k == _SEQ:
            fields = getattr(type(v), "_fields", None)
            seq = list.__iter__(v) if isinstance(v, list) else tuple.__iter__(v)
            items = zip(fields, seq) if isinstance(fields, tuple) else enumerate(seq)
            child_role = role if role == "quant_state" else "container"
        else:
            d = _instance_dict(v)
            items = list(d.items()) if d else []
            if hasattr(type(v), "__slots__"):
                items.extend(_slot_items(v))
            child_role = "quant_state" if role == "quant_state" else "attribute"
        for i, (ck, cv) in enumerate(items):
            if i >= MAX_ITEMS:
                self.truncate(path, f"more than {MAX_ITEMS} items in one container")
                break
            self.value(cv, _join(path, ck), v, ck, "item" if k in (_MAPPING, _SEQ) else "attr", module, mpath,
                       child_role, depth + 1, moved)
        self.seen_obj[oid] = (path, lst, start, len(lst))

    # -- accelerate offload hooks ---------------------------------------------------------------------
    def offload_hooks(self) -> None:
        offloaded: set[int] = set()
        for mpath, mod, hook in self.w.hooks:
            for h in _hook_chain(hook):
                hd = _instance_dict(h) or {}
                wm = hd.get("weights_map")
                if not hd.get("offload") or wm is None:
                    continue
                wmd = _instance_dict(wm) or {}
                dataset, prefix = wmd.get("dataset"), wmd.get("prefix", "")
                store = dataset if isinstance(dataset, dict) else (_instance_dict(dataset) or {}).get("state_dict")
                md = _instance_dict(mod) or {}
                for attr in ("_parameters", "_buffers"):
                    for name, t in dict.items(md.get(attr) or {}):
                        if not isinstance(t, torch.Tensor):
                            continue
                        offloaded.add(id(t))
                        copy = dict.get(store, f"{prefix}{name}") if isinstance(store, dict) else None
                        if isinstance(copy, torch.Tensor):
                            self.out.append(Entry(_join(mpath, f"_hf_hook.weights_map.{name}"), "offloaded", copy, wm,
                                                 f"{prefix}{name}", "item", mod, mpath, False))
        if offloaded:
            for e in self.w.entries:
                if id(e.tensor) in offloaded:
                    e.role = "offloaded"


def _hook_chain(hook: Any) -> list[Any]:
    hd = _instance_dict(hook) or {}
    inner = hd.get("hooks")
    if isinstance(inner, (list, tuple)):
        return [h for h in inner]
    return [hook]


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
        k = _kind(obj)
        if k in (_MAPPING, _SEQ, _OBJ):
            wk.value(obj, "", None, None, "item", None, "", "container" if k != _OBJ else "attribute", -1)
            # the root object's own path prefix is empty: strip the leading dot a '' join may not add
        wk.out = wk.w.entries
        wk.run_modules()
    # list-held modules found while walking attributes are expanded by run_modules' loop; tensors found outside
    # module trees come last (containers, scheduler tensors)
    wk.out = wk.w.entries
    wk.run_modules()
    wk.w.entries.extend(rest)
    wk.offload_hooks()
    first: dict[int, str] = {}
    for e in wk.w.entries:
        p = first.setdefault(id(e.tensor), e.path)
        if p != e.path:
            e.alias_of = p
    return wk.w


def set_tensor(entry: Entry, new: torch.Tensor) -> None:
    """Put ``new`` where ``entry`` was found (parameter/buffer slot, ``__dict__``, dict or list item)."""
    owner, key = entry.owner, entry.key
    if entry.slot == "param":
        owner._parameters[key] = new
    elif entry.slot == "buffer":
        owner._buffers[key] = new
    elif entry.slot == "item":
        if isinstance(owner, (dict, list)):
            owner[key] = new
        else:
            raise TypeError(f"{entry.path}: cannot replace an item of an immutable {type(owner).__name__}")
    else:
        d = _instance_dict(owner)
        if d is not None and key in d:
            d[key] = new
        else:
            object.__setattr__(owner, key, new)
    entry.tensor = new
