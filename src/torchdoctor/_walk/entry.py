"""What a walk returns: ``Entry`` (one tensor at one path, and how to put a replacement back) and ``Walk``."""

from __future__ import annotations

import collections
import functools
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from torchdoctor._report.model import Problem, TensorInfo
from torchdoctor._walk.kinds import describe, form_of, hook_chain, instance_dict


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
            tp = type(t)
            try:
                if tp is not torch.Tensor and tp is not nn.Parameter:
                    raise TypeError  # subclasses: sizes may be symbolic (jagged nested tensors)
                shape, nbytes = tuple(t.shape), t.nbytes  # numel * itemsize, one call
            except Exception:  # nested (no sizes), sparse COO (no nbytes), subclasses
                shape, nbytes = describe(t)
            info = self._info = TensorInfo(self.path, self.role, t.device, t.dtype, shape, nbytes,
                                           self.moved_by_module_to, self.alias_of)
        return info

    @property
    def form(self) -> str:
        """``dense``, ``nested``, ``sparse``, ``quantized``, ``dtensor`` or ``subclass`` (see ``form_of``)."""
        return form_of(self.tensor)

    def __repr__(self) -> str:
        return f"Entry({self.path!r}, {self.role}, {self.info().compact})"


_new = object.__new__


def new_entry(path: str, role: str, tensor: torch.Tensor, owner: Any, key: Any, slot: str, module: nn.Module | None,
              module_path: str, moved: bool) -> Entry:
    """``Entry(...)``, made as a plain function call: a class call goes through ``type.__call__`` and a second
    frame for ``__init__``, which was a tenth of the walker's cost per parameter (issue 28)."""
    e = _new(Entry)
    e.path = path
    e.role = role
    e.tensor = tensor
    e.owner = owner
    e.key = key
    e.slot = slot
    e.module = module
    e.module_path = module_path
    e.moved_by_module_to = moved
    e.alias_of = None
    e._info = None
    return e


class Walk:
    """The result of one walk: ``entries`` in canonical order, ``modules``, ``roots``, ``problems``."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.modules: list[tuple[str, nn.Module]] = []
        self.roots: list[tuple[str, nn.Module]] = []  # components: the root module or top-level modules
        self.detached: list[tuple[str, nn.Module]] = []  # modules held in plain lists/dicts/attributes of modules
        self.problems: list[Problem] = []
        self._module_paths: dict[int, str] | None = None  # made from ``modules`` when first read
        self.types: set[type] = set()  # the classes of ``modules`` (every class is checked once per class)
        self.hooks: list[tuple[str, nn.Module, Any]] = []  # (module path, module, accelerate hook)
        # modules with both forward pre-hooks and forward hooks of their own, at their first path (read from each
        # module's __dict__ as the walk passes it: a second loop over the modules was a few % of a UNet's scan)
        self.hooked: list[tuple[str, nn.Module]] = []
        # forwards replaced by another module's method: (patched module path, patched module, its network's path)
        self.patches: list[tuple[str, nn.Module, str]] = []
        # component path -> the plain object holding it as an attribute (ComfyUI's / Forge's ModelPatcher.model)
        self.holders: dict[str, Any] = {}

    @property
    def module_paths(self) -> dict[int, str]:
        """Module id -> its first path. ``modules`` lists each module once, at its first path, so this is made from
        it when first read (most scans never read it: a dict store per module was a few % of a first scan)."""
        mp = self._module_paths
        if mp is None:
            mp = self._module_paths = {id(m): p for p, m in self.modules}
        return mp

    @module_paths.setter
    def module_paths(self, value: dict[int, str]) -> None:
        self._module_paths = value

    @property
    def truncated(self) -> bool:
        return bool(self.problems) and any(p.kind == "truncated" for p in self.problems)

    def canonical(self) -> Iterator[Entry]:
        return (e for e in self.entries if e.alias_of is None)


def offloaded(w: Walk, out: list[Entry]) -> None:
    """accelerate's offload hooks: each offloaded weight's ``weights_map`` copy is an entry (role ``offloaded``, added
    to ``out``), and the module's own meta placeholders take the role ``offloaded``."""
    found: set[int] = set()
    for mpath, mod, hook in w.hooks:
        for h in hook_chain(hook):
            hd = instance_dict(h) or {}
            wm = hd.get("weights_map")
            if not hd.get("offload") or wm is None:
                continue
            wmd = instance_dict(wm) or {}
            dataset, prefix = wmd.get("dataset"), wmd.get("prefix", "")
            store = dataset if isinstance(dataset, dict) else (instance_dict(dataset) or {}).get("state_dict")
            md = instance_dict(mod) or {}
            for attr in ("_parameters", "_buffers"):
                for name, t in dict.items(md.get(attr) or {}):
                    if not isinstance(t, torch.Tensor):
                        continue
                    found.add(id(t))
                    copy = dict.get(store, f"{prefix}{name}") if isinstance(store, dict) else None
                    if isinstance(copy, torch.Tensor):
                        out.append(Entry(join_path(mpath, f"_hf_hook.weights_map.{name}"), "offloaded", copy, wm,
                                         f"{prefix}{name}", "item", mod, mpath, False))
    if found:
        for e in w.entries:
            if id(e.tensor) in found:
                e.role = "offloaded"


def join_path(prefix: str, key: Any) -> str:
    """``prefix.key`` as a user would type it (ints as indices, other keys by a short description)."""
    name = key if isinstance(key, str) else str(key) if isinstance(key, int) else _key_repr(key)
    return f"{prefix}.{name}" if prefix else name


def _key_repr(key: Any) -> str:
    if isinstance(key, (int, float, bool, bytes)) or key is None:
        return str(key)
    if isinstance(key, tuple) and len(key) <= 4 and all(isinstance(k, (str, int)) for k in key):
        return "(" + ",".join(str(k) for k in key) + ")"
    return f"<{type(key).__name__}>"


def set_tensor(entry: Entry, new: torch.Tensor) -> None:
    """Put ``new`` where ``entry`` was found (parameter/buffer slot, ``__dict__``, dict/list/deque item, dict key,
    set member, closure cell, ``functools.partial`` argument, function default)."""
    owner, key, slot, old = entry.owner, entry.key, entry.slot, entry.tensor
    if slot == "param":
        owner._parameters[key] = new
    elif slot == "buffer":
        owner._buffers[key] = new
    elif slot == "item":
        if isinstance(owner, (dict, list, collections.deque)):
            owner[key] = new
        else:
            raise TypeError(f"{entry.path}: cannot replace an item of an immutable {type(owner).__name__}")
    elif slot == "key" and isinstance(owner, dict):
        dict.__setitem__(owner, new, dict.pop(owner, old))  # tensors hash by identity
    elif slot == "member" and isinstance(owner, set):
        set.discard(owner, old)
        set.add(owner, new)
    elif slot == "cell":
        owner.cell_contents = new
    elif slot == "arg" and isinstance(owner, functools.partial):
        i = int(str(key).rpartition(".")[2])
        state: Any = functools.partial.__reduce__(owner)[2]
        func, args, kw, d = state
        functools.partial.__setstate__(owner, (func, (*args[:i], new, *args[i + 1:]), kw, d))  # type: ignore[attr-defined]
    elif slot == "default" and isinstance(owner, types.FunctionType):
        i = int(str(key).rpartition(".")[2])
        defaults = owner.__defaults__ or ()
        owner.__defaults__ = (*defaults[:i], new, *defaults[i + 1:])
    elif slot in ("key", "member", "arg", "default", "func", "inner"):
        raise TypeError(f"{entry.path}: cannot replace a tensor held in a {type(owner).__name__} ({slot})")
    else:
        d = instance_dict(owner)
        if d is not None and key in d:
            d[key] = new
        else:
            object.__setattr__(owner, key, new)
    entry.tensor = new
