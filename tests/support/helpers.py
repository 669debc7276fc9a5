"""The read-only invariant (read-only verbs never change the user's objects or files): fingerprints of objects and files, compared around a call.

``fingerprint(obj)`` walks everything reachable from ``obj`` through ``__dict__``, slots and builtin
containers and records, per dotted path:

* tensors: a hash of the storage bytes (metadata only on meta), type, identity, device, dtype, shape,
  stride, offset, ``requires_grad``, version counter, ``.grad`` and tensor hooks, then the tensor's own
  ``__dict__`` (where bitsandbytes keeps ``quant_state`` / ``CB`` / ``SCB``);
* every other object: its type, identity and ``__dict__`` key list (so replaced modules or Parameters,
  added/removed attributes, modules and hooks all show); atoms (numbers, strings, dtypes...) by value;
* torch's global state: module hooks of ``torch.nn.modules.module``, the torch function / dispatch mode
  stacks, default dtype/device, grad / inference / autocast flags, and the identity of the device runtime
  functions a simulator might patch (``torch.cuda.is_available`` ...).

It is written independently of torchdoctor's walker (which it checks) and never runs user code: no
``getattr`` on user objects, no properties, ``__iter__``, ``__eq__``, ``__hash__`` or ``__repr__`` of user
types; tensors are read through ``torch._C.TensorBase`` with torch-function subclasses disabled.

>>> import torch
>>> model = torch.nn.Linear(2, 2)
>>> fingerprint(model) == fingerprint(model)
True
>>> assert_unchanged(model, lambda m: tuple(m.weight.shape), model)
(2, 2)
>>> assert_unchanged(model, model.register_forward_hook, lambda *a: None)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
AssertionError: the call changed the object (2 differences):
  changed  _forward_hooks: dict collections.OrderedDict keys +...
  added    _forward_hooks[...]: ('opaque', 'builtins.function', ...)
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import os
import stat
import sys
import threading
import types
import weakref
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import torch

__all__ = ["MAX_DEPTH", "MAX_NODES", "Fingerprint", "assert_unchanged", "diff", "fingerprint", "fingerprint_path"]

MAX_DEPTH = 100
MAX_NODES = 1_000_000
MAX_FILES = 100_000
MAX_DIFF_LINES = 20

T = TypeVar("T")


class Fingerprint(tuple):  # type: ignore[type-arg]
    """A tuple of ``(path, record)`` pairs in walk order: hashable, comparable, diffable.

    It also holds a reference to every object it saw (``keep``), so that while it lives no replaced object
    can hand its ``id()`` to its replacement and make the two fingerprints look alike.
    """

    keep: list[Any]


_TB: Any = torch._C.TensorBase  # read through its C descriptors, bypassing subclass overrides
_ATOMS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.layout,
          torch.memory_format, type(Ellipsis), type(NotImplemented))
# Things whose inside is code or process state, not user data: recorded by identity, never entered.
_OPAQUE = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
           types.MethodWrapperType, types.WrapperDescriptorType, types.MethodDescriptorType,
           types.GetSetDescriptorType, types.MemberDescriptorType, types.CodeType, types.FrameType,
           types.GeneratorType, types.CoroutineType, types.TracebackType, property, staticmethod, classmethod,
           functools.partial, logging.Logger, logging.Handler, io.IOBase, type(threading.Lock()),
           type(threading.RLock()), threading.Thread, threading.Event, threading.Condition)
_MODULE_DICTS = ("_parameters", "_buffers", "_modules")


def _qualname(cls: type) -> str:
    return f"{type.__dict__['__module__'].__get__(cls)}.{type.__dict__['__qualname__'].__get__(cls)}"


def _instance_dict(obj: object) -> dict[str, Any] | None:
    """``obj.__dict__`` through the C descriptor only; a Python-level ``__dict__`` property is not run."""
    for klass in type(obj).__mro__:
        descr = type.__dict__["__dict__"].__get__(klass).get("__dict__")
        if descr is not None:
            if type(descr) is types.GetSetDescriptorType:
                try:
                    d = descr.__get__(obj, type(obj))
                except Exception:
                    return None
                return d if type(d) is dict else None
            return None
    return None


def _slots(obj: object) -> list[tuple[str, Any]]:
    out = []
    for klass in type(obj).__mro__:
        for name, descr in type.__dict__["__dict__"].__get__(klass).items():
            if type(descr) is types.MemberDescriptorType and name != "__weakref__":
                try:
                    out.append((name, descr.__get__(obj, type(obj))))
                except AttributeError:  # an unset slot
                    out.append((name, _UNSET))
    return out


class _Unset:
    pass


_UNSET = _Unset()


def _atom(x: Any) -> Hashable:
    t = type(x)
    if t is float or t is complex:
        return (t.__name__, repr(x))  # nan == nan by repr
    if t in (torch.dtype, torch.device, torch.layout, torch.memory_format):
        return (t.__name__, str(x))
    if t is str and len(x) > 256:
        return ("str", len(x), hashlib.blake2b(x.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest())
    return (t.__name__, x)


def _key_label(k: Any) -> str:
    if type(k) in _ATOMS or (type(k) is tuple and all(type(i) in _ATOMS for i in k)):
        return repr(k)
    return f"<{_qualname(type(k))}#{id(k)}>"


class _Walker:
    def __init__(self) -> None:
        self.records: list[tuple[str, Hashable]] = []
        self.seen: dict[int, str] = {}
        # Visited objects stay alive until the walker dies: a replaced object cannot hand its id() to its
        # replacement while a check is running.
        self.keep: list[Any] = []
        self.storages: dict[tuple[Any, ...], Hashable] = {}
        self.nodes = 0
        self.truncated = False

    def add(self, path: str, record: Hashable) -> None:
        self.records.append((path, record))

    def visit(self, x: Any, path: str, depth: int) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES or depth > MAX_DEPTH:
            self.truncated = True
            self.add(path, ("<truncated>",))
            return
        cls = type(x)
        if cls in _ATOMS:
            self.add(path, _atom(x))
            return
        if issubclass(cls, torch.Size):
            self.add(path, ("Size", tuple(int.__index__(i) for i in tuple.__iter__(x))))
            return
        prev = self.seen.get(id(x))
        if prev is not None:
            self.add(path, ("alias", prev))
            return
        self.seen[id(x)] = path
        self.keep.append(x)
        if issubclass(cls, torch.Tensor):
            self.tensor(x, path, depth)
        elif issubclass(cls, _OPAQUE):
            self.opaque(x, path)
        elif issubclass(cls, dict):
            self.mapping(x, path, depth)
        elif issubclass(cls, (list, tuple, deque)):
            base = list if issubclass(cls, list) else tuple if issubclass(cls, tuple) else deque
            items = list(base.__iter__(x))
            self.add(path, ("seq", _qualname(cls), id(x), len(items)))
            for i, item in enumerate(items):
                self.visit(item, f"{path}[{i}]", depth + 1)
            self.attributes(x, path, depth)
        elif issubclass(cls, (set, frozenset)):
            items = list((set if issubclass(cls, set) else frozenset).__iter__(x))
            atoms = sorted(repr(_atom(i)) for i in items if type(i) in _ATOMS)
            others = sorted((i for i in items if type(i) not in _ATOMS), key=id)
            self.add(path, ("set", _qualname(cls), id(x), tuple(atoms), len(others)))
            for i, item in enumerate(others):
                self.visit(item, f"{path}{{{i}}}", depth + 1)
        elif issubclass(cls, weakref.ref):
            target = weakref.ref.__call__(x)
            self.add(path, ("weakref", id(x), None if target is None else id(target)))
        elif issubclass(cls, torch.Generator):
            state = torch.Generator.get_state(x)
            self.add(path, ("generator", id(x), str(torch.Generator.device.__get__(x)), self.digest(state)))
        elif _qualname(cls) == "numpy.ndarray":
            self.ndarray(x, path)
        else:
            self.obj(x, path, depth)

    def opaque(self, x: Any, path: str) -> None:
        cls = type(x)
        if cls is types.MethodType:  # a bound method: which function, bound to which object
            self.add(path, ("method", id(x.__func__), id(x.__self__)))
        elif cls is functools.partial:
            self.add(path, ("partial", id(x), id(functools.partial.func.__get__(x))))
        else:
            self.add(path, ("opaque", _qualname(cls), id(x)))

    def mapping(self, d: dict[Any, Any], path: str, depth: int) -> None:
        items = list(dict.items(d))
        self.keep.extend(k for k, _ in items)
        self.add(path, ("dict", _qualname(type(d)), id(d), tuple(_key_label(k) for k, _ in items)))
        for k, v in items:
            self.visit(v, f"{path}[{_key_label(k)}]", depth + 1)
        self.attributes(d, path, depth)

    def attributes(self, x: Any, path: str, depth: int) -> None:
        """The ``__dict__`` of a container subclass (ModelOutput, FrozenDict, a namedtuple subclass...)."""
        d = _instance_dict(x)
        if d:
            self.add(_join(path, "<dict>"), tuple(d))
            for k, v in list(d.items()):
                self.visit(v, _join(path, k), depth + 1)

    def obj(self, x: Any, path: str, depth: int) -> None:
        d = _instance_dict(x)
        slots = _slots(x)
        self.add(path, ("obj", _qualname(type(x)), id(x), None if d is None else tuple(d), tuple(n for n, _ in slots)))
        if d is not None:
            keys = list(d)
            if issubclass(type(x), torch.nn.Module):
                # parameters, buffers and submodules first, under the paths users type (layers.0.q_proj.weight)
                for k in _MODULE_DICTS:
                    sub = d.get(k)
                    if type(sub) is dict:
                        keys.remove(k)
                        self.seen[id(sub)] = _join(path, f"<{k}>")
                        self.keep.append(sub)
                        self.add(_join(path, f"<{k}>"), ("dict", "builtins.dict", id(sub),
                                                            tuple(_key_label(n) for n in sub)))
                        for name, v in list(sub.items()):
                            self.visit(v, _join(path, str(name)), depth + 1)
            for k in keys:
                self.visit(d[k], _join(path, k), depth + 1)
        for name, v in slots:
            if v is _UNSET:
                self.add(_join(path, name), ("<unset>",))
            else:
                self.visit(v, _join(path, name), depth + 1)

    def digest(self, t: torch.Tensor) -> Hashable:
        """Hash of the whole storage under ``t``, once per storage (views and tied weights share it)."""
        try:
            st = _TB.untyped_storage(t)
        except Exception as exc:  # wrapper subclasses have no storage; their inners are in __dict__
            return ("nostorage", type(exc).__name__)
        if st.device.type == "meta":
            return ("meta", st.nbytes())
        key = (str(st.device), st.data_ptr(), st.nbytes())
        cached = self.storages.get(key)
        if cached is None:
            u8 = torch.empty(0, dtype=torch.uint8, device=st.device).set_(st)
            if u8.device.type != "cpu":
                u8 = u8.cpu()
            cached = ("bytes", st.nbytes(), hashlib.blake2b(u8.numpy().data, digest_size=16).hexdigest())
            self.storages[key] = cached
        return cached

    def tensor(self, t: torch.Tensor, path: str, depth: int) -> None:
        with torch._C.DisableTorchFunctionSubclass(), torch.no_grad():
            try:
                device = _TB.device.__get__(t)
                layout = _TB.layout.__get__(t)
                strided = layout == torch.strided
                try:
                    version: int | None = _TB._version.__get__(t)
                except RuntimeError:  # inference tensors have no version counter
                    version = None
                leaf = _TB.is_leaf.__get__(t)
                record: tuple[Any, ...] = (
                    "tensor", _qualname(type(t)), id(t), str(device), str(_TB.dtype.__get__(t)), str(layout),
                    tuple(_TB.size(t)), tuple(_TB.stride(t)) if strided else None,
                    _TB.storage_offset(t) if strided else None, _TB.requires_grad.__get__(t), leaf, version,
                    self.digest(t) if strided else ("layout", str(layout)),
                    _hook_keys(_TB._backward_hooks.__get__(t)),
                    _hook_keys(_TB._post_accumulate_grad_hooks.__get__(t)),
                )
                grad = _TB.grad.__get__(t) if leaf else None
            except Exception as exc:
                record, grad = ("tensor", _qualname(type(t)), id(t), "<unreadable>", type(exc).__name__), None
        self.add(path, record)
        if grad is not None:
            self.visit(grad, _join(path, "<grad>"), depth + 1)
        d = _instance_dict(t)
        if d:
            self.add(_join(path, "<dict>"), tuple(d))
            for k, v in list(d.items()):
                self.visit(v, _join(path, k), depth + 1)

    def ndarray(self, a: Any, path: str) -> None:
        import numpy as np

        if a.dtype.hasobject:
            self.add(path, ("ndarray", id(a), str(a.dtype), a.shape, "<objects>"))
            return
        data = np.ascontiguousarray(a).view(np.uint8)
        self.add(path, ("ndarray", id(a), str(a.dtype), a.shape, a.strides, hashlib.blake2b(data.data, digest_size=16).hexdigest()))


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _hook_keys(hooks: Any) -> Hashable:
    return None if hooks is None else tuple(_key_label(k) for k in dict.keys(hooks))


# The functions a device simulator patches: if any is still replaced after a call, that call leaked.
_RUNTIME_FUNCTIONS = {
    "torch": ("Generator", "device", "empty", "tensor", "zeros", "ones", "randn"),
    "torch.cuda": ("is_available", "device_count", "current_device", "set_device", "get_device_capability",
                   "get_device_properties", "get_device_name", "mem_get_info", "synchronize", "is_bf16_supported",
                   "Stream", "Event", "empty_cache"),
    "torch.xpu": ("is_available", "device_count", "current_device", "synchronize"),
    "torch.backends.mps": ("is_available", "is_built"),
    "torch.mps": ("synchronize", "empty_cache"),
}
_PATCHABLE_METHODS = ((torch.Tensor, ("to", "cuda", "cpu", "xpu", "__getitem__", "__setitem__", "copy_", "item")),
                      (torch.nn.Module, ("to", "cuda", "cpu", "xpu", "_apply", "__call__", "_call_impl")))


def _torch_state() -> list[tuple[str, Hashable]]:
    """One record per piece of torch global state, so a diff names the piece that leaked."""
    from torch.nn.modules import module as mm

    out: list[tuple[str, Hashable]] = []
    for name, value in sorted(vars(mm).items()):
        if name.startswith("_global_"):
            out.append((f"<torch>.{name}", _hook_keys(value) if isinstance(value, dict) else repr(value)))
    out += [
        ("<torch>.function_mode_stack", torch._C._len_torch_function_stack()),
        ("<torch>.dispatch_mode_stack", torch._C._len_torch_dispatch_stack()),
        ("<torch>.default_dtype", str(torch.get_default_dtype())),
        ("<torch>.default_device", str(torch.get_default_device())),
        ("<torch>.grad_enabled", torch.is_grad_enabled()),
        ("<torch>.inference_mode", torch.is_inference_mode_enabled()),
    ]
    out += [(f"<torch>.autocast.{d}", torch.is_autocast_enabled(d)) for d in ("cpu", "cuda", "xpu", "mps")]
    for modname, names in _RUNTIME_FUNCTIONS.items():
        namespace = vars(sys.modules[modname]) if modname in sys.modules else {}
        out += [(f"<torch>.{modname}.{n}", id(namespace.get(n))) for n in names]
    for cls, names in _PATCHABLE_METHODS:
        attrs = type.__dict__["__dict__"].__get__(cls)
        out += [(f"<torch>.{_qualname(cls)}.{n}", id(attrs.get(n))) for n in names]
    return out


def _walk(obj: Any, torch_state: bool) -> _Walker:
    walker = _Walker()
    walker.visit(obj, "", 0)
    if torch_state:
        walker.records.extend(_torch_state())
    return walker


def fingerprint(obj: Any, *, torch_state: bool = True) -> Fingerprint:
    """A hashable, comparable fingerprint of everything reachable from ``obj`` (see the module docstring).

    ``torch_state=False`` leaves out torch's global state (hooks, modes, flags, patched runtime functions).
    """
    walker = _walk(obj, torch_state)
    fp = Fingerprint(walker.records)
    fp.keep = walker.keep
    return fp


def diff(before: Fingerprint, after: Fingerprint, limit: int = MAX_DIFF_LINES) -> list[str]:
    """Readable lines saying which paths were added, removed or changed between two fingerprints."""
    a, b = _by_path(before), _by_path(after)
    lines = []
    for path, rec in b.items():
        if path not in a:
            lines.append(f"  added    {path or '<root>'}: {rec}")
        elif a[path] != rec:
            lines.append(f"  changed  {path or '<root>'}: {_describe(a[path], rec)}")
    lines.extend(f"  removed  {path or '<root>'}: {rec}" for path, rec in a.items() if path not in b)
    if not lines and before != after:
        lines.append("  the walk order changed")
    if len(lines) > limit:
        lines = [*lines[:limit], f"  ... and {len(lines) - limit} more"]
    return lines


_TENSOR_FIELDS = ("kind", "type", "id", "device", "dtype", "layout", "shape", "stride", "offset", "requires_grad",
                  "is_leaf", "version", "data", "backward_hooks", "post_accumulate_grad_hooks")


def _describe(a: Hashable, b: Hashable) -> str:
    """What changed in one record: key additions/removals, or the tensor fields that differ."""
    if not (type(a) is tuple and type(b) is tuple and a[:1] == b[:1]):
        return f"{a} -> {b}"
    if a[0] in ("obj", "dict") and a[1:3] == b[1:3]:
        ka, kb = a[3] or (), b[3] or ()
        keys = [f"+{k}" for k in kb if k not in ka] + [f"-{k}" for k in ka if k not in kb]
        if keys:
            return f"{a[0]} {a[1]} keys {' '.join(keys)}"
    if a[0] == "tensor" and len(a) == len(b) == len(_TENSOR_FIELDS):
        return ", ".join(f"{name} {x} -> {y}" for name, x, y in zip(_TENSOR_FIELDS, a, b) if x != y)
    return f"{a} -> {b}"


def _by_path(fp: Fingerprint) -> dict[str, Hashable]:
    out: dict[str, Hashable] = {}
    for path, rec in fp:
        key, n = path, 1
        while key in out:
            n += 1
            key = f"{path}#{n}"
        out[key] = rec
    return out


def _count(before: Fingerprint, after: Fingerprint) -> int:
    a, b = _by_path(before), _by_path(after)
    return sum(1 for p in b if a.get(p, _UNSET) != b[p]) + sum(1 for p in a if p not in b)


def assert_unchanged(obj: Any, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Call ``fn(*args, **kwargs)`` and assert that ``obj`` did not change; return what ``fn`` returned.

    ``obj`` is not passed to ``fn`` (write ``assert_unchanged(model, scan, model, dtype=...)``). A ``str`` or
    ``os.PathLike`` ``obj`` is a file or directory, compared with ``fingerprint_path``. If ``fn`` raises,
    the exception propagates, unless the object changed too: then the AssertionError says so.
    """
    is_path = isinstance(obj, (str, os.PathLike))
    before_fp = fingerprint_path(obj) if is_path else fingerprint(obj)
    if any(rec == ("<truncated>",) for _, rec in before_fp):
        raise AssertionError(f"the {'path' if is_path else 'object'} is larger than the fingerprint bounds "
                             f"(MAX_NODES={MAX_NODES}, MAX_DEPTH={MAX_DEPTH}, MAX_FILES={MAX_FILES}): "
                             "the check would be incomplete")
    error: BaseException | None = None
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        error = exc
    after_fp = fingerprint_path(obj) if is_path else fingerprint(obj)
    if before_fp != after_fp:
        lines = diff(before_fp, after_fp)
        what = "path" if is_path else "object"
        message = f"the call changed the {what} ({_count(before_fp, after_fp)} difference" \
                  f"{'s' if _count(before_fp, after_fp) != 1 else ''}):\n" + "\n".join(lines)
        if error is not None:
            raise AssertionError(message + f"\n(and it raised {type(error).__name__}: {error})") from error
        raise AssertionError(message)
    if error is not None:
        raise error
    return result


def fingerprint_path(path: str | os.PathLike[str]) -> Fingerprint:
    """Fingerprint of a file or a directory tree: per entry its kind, size, mode, mtime and content hash.

    Symlinks are recorded by target, not followed; access times are left out (reading changes them).
    """
    root = os.fspath(path)
    records: list[tuple[str, Hashable]] = []

    def entry(full: str, rel: str) -> None:
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            records.append((rel, ("missing",)))
            return
        base = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_mtime_ns)
        if stat.S_ISLNK(st.st_mode):
            records.append((rel, ("link", *base, os.readlink(full))))
        elif stat.S_ISREG(st.st_mode):
            h = hashlib.blake2b(digest_size=16)
            with open(full, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            records.append((rel, ("file", *base, st.st_size, h.hexdigest())))
        elif stat.S_ISDIR(st.st_mode):
            names = sorted(os.listdir(full))
            records.append((rel, ("dir", *base, tuple(names))))
            for name in names:
                if len(records) > MAX_FILES:
                    records.append((rel, ("<truncated>",)))
                    return
                entry(os.path.join(full, name), f"{rel}/{name}" if rel else name)
        else:
            records.append((rel, ("other", *base)))

    entry(root, "")
    fp = Fingerprint(records)
    fp.keep = []
    return fp
