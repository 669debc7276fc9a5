"""What the walker meets, classified: object kinds, tensor forms, and how to read either without running user code.

Objects are read through the builtin methods of their base type (``dict.items``, ``set.__iter__``,
``deque.__iter__``, the member descriptors of ``functools.partial`` and functions), so a subclass's ``__iter__``,
``__eq__``, ``__hash__`` or properties never run. Tensors of every layout are described by shape and bytes even
where ``Tensor.shape`` refuses (strided nested tensors) or holds symbolic sizes (jagged nested tensors: ragged
dimensions are ``-1``).
"""

from __future__ import annotations

import collections
import enum
import functools
import types
import weakref
from collections.abc import Iterator
from itertools import chain, compress
from typing import Any

import torch
from torch import nn

ATOM, TENSOR, MODULE, MAPPING, SEQ, SKIP, OBJ, HOOK, SET, DEQUE, PARTIAL, FUNC = range(12)
# kinds whose children are read by ``members`` (each child with its own slot for ``set_tensor``)
MEMBER_KINDS = frozenset({SET, DEQUE, PARTIAL, FUNC})

_ATOM_TYPES = (str, bytes, bytearray, int, float, complex, bool, type(None), range, enum.Enum, torch.dtype,
               torch.device, torch.Size, memoryview, slice)
_SKIP_TYPES = (type, types.ModuleType, types.BuiltinFunctionType, types.MethodType, property, staticmethod,
               classmethod, weakref.ref, weakref.ProxyType, types.GeneratorType, types.CoroutineType, types.FrameType,
               types.CodeType, types.TracebackType, types.MappingProxyType, types.MethodWrapperType,
               types.WrapperDescriptorType)
# Objects that hold global or enormous state and never own model tensors.
_SKIP_MODULE_PREFIXES = ("logging", "threading", "multiprocessing", "asyncio", "concurrent", "socket", "ssl", "_io",
                         "io", "typing", "numpy", "tokenizers", "PIL", "queue", "subprocess", "sqlite3", "_thread")
_SKIP_BASE_NAMES = frozenset({"PreTrainedTokenizerBase", "ImageProcessingMixin", "FeatureExtractionMixin",
                              "ProcessorMixin", "Logger", "Handler"})
# Owners whose tensors are quantization metadata (role quant_state).
_QUANT_PREFIXES = ("bitsandbytes", "torchao", "optimum.quanto", "optimum_quanto", "compressed_tensors", "auto_gptq",
                   "gptqmodel", "awq", "hqq", "quanto", "fp8", "transformer_engine")
FAST_ATOMS = frozenset({str, int, float, bool, type(None), torch.dtype, torch.device})
PLAIN = (torch.Tensor, nn.Parameter)
_ATOMS_GE = FAST_ATOMS.issuperset
_SEQS = frozenset({tuple, list})  # exact types only: a subclass's iteration could run its own code
_ATOMS_OR_SEQS = FAST_ATOMS | _SEQS
_SEQS_GE = _SEQS.issuperset
_flat = chain.from_iterable

_KIND_CACHE: dict[type, int] = {}


def _classify(tp: type) -> int:
    if issubclass(tp, torch.Tensor):
        return TENSOR
    if issubclass(tp, nn.Module):
        return MODULE
    if issubclass(tp, _ATOM_TYPES):
        return ATOM
    if issubclass(tp, (set, frozenset)):
        return SET
    if issubclass(tp, collections.deque):
        return DEQUE
    if issubclass(tp, functools.partial):
        return PARTIAL
    if tp is types.FunctionType:
        return FUNC
    if issubclass(tp, _SKIP_TYPES):
        return SKIP
    if issubclass(tp, dict):
        return MAPPING
    if issubclass(tp, (list, tuple)):
        return SEQ
    mod = getattr(tp, "__module__", "") or ""
    if mod.startswith("accelerate.hooks"):
        return HOOK
    if mod.split(".")[0] in _SKIP_MODULE_PREFIXES or any(b.__name__ in _SKIP_BASE_NAMES for b in tp.__mro__):
        return SKIP
    return OBJ


def atoms_only(v: Any, k: int, limit: int) -> bool:
    """A dict, list, tuple or set (kind ``k``) holding plain values only (a config's label maps, a model's lists of
    module names), proved at C speed through the builtin types' own methods: walking it item by item would find
    nothing. One past ``limit`` items is not proved (the walker's item loop reports it)."""
    if k == MAPPING:
        if dict.__len__(v) > limit or not _ATOMS_GE(map(type, dict.keys(v))):
            return False
        # a transformers model's plans map names to tuples of lists of names (``_pp_plan``): two levels of plain
        # tuples and lists of plain values are proved here too, instead of one walker record per inner list
        return plain_values(dict.values(v))
    if k == SEQ:
        base: Any = list if isinstance(v, list) else tuple
    else:
        base = set if isinstance(v, set) else frozenset
    return bool(base.__len__(v) <= limit and _ATOMS_GE(map(type, base.__iter__(v))))


def plain_values(vals: Any) -> bool:
    """Every one of ``vals`` (a dict's values, re-iterable) is a plain value or a short exact ``tuple`` / ``list``
    of them, two deep (``_plain_nested``): a plan's own shape (every value a sequence of sequences of plain values)
    is proved in one pass a level; any other mix level by level."""
    if _ATOMS_GE(map(type, vals)):
        return True
    if _SEQS_GE(map(type, vals)) and max(map(len, vals)) <= 64:
        inner = list(_flat(vals))
        if _SEQS_GE(map(type, inner)) and (not inner or max(map(len, inner)) <= 64) and _ATOMS_GE(
                map(type, _flat(inner))):
            return True
    return _plain_nested(list(vals))


def _plain_nested(vals: list[Any]) -> bool:
    """Every one of ``vals`` is a plain value or a short (at most 64) exact ``tuple`` / ``list`` of them, nested two
    deep (a plan's tuples of lists of names), proved a level at a time at C speed: one recursive call per
    sequence cost more than the proof of the rest of a transformers root."""
    for depth in (2, 1, 0):
        tps = list(map(type, vals))
        if _ATOMS_GE(tps):
            return True
        if not depth or not _ATOMS_OR_SEQS.issuperset(tps):
            return False
        seqs = list(compress(vals, map(_SEQS.__contains__, tps)))
        if max(map(len, seqs)) > 64:
            return False
        vals = list(chain.from_iterable(seqs))
    return False  # not reached: depth 0 returned above


def kind(obj: Any) -> int:
    tp = type(obj)
    k = _KIND_CACHE.get(tp)
    if k is None:
        k = _KIND_CACHE[tp] = _classify(tp)
    return k


def is_quant_type(tp: type) -> bool:
    """Is ``tp`` a class of a quantization library (its tensors are quantization metadata)?

    >>> is_quant_type(torch.Tensor)
    False
    """
    mod = getattr(tp, "__module__", "") or ""
    return mod.startswith(_QUANT_PREFIXES)


def is_jagged_type(tp: type) -> bool:
    """A jagged nested tensor class: one tensor to the user, its ``_values``/``_offsets``/caches are internals."""
    return tp.__name__ == "NestedTensor" and (getattr(tp, "__module__", "") or "").startswith("torch.nested")


def instance_dict(obj: Any) -> dict[str, Any] | None:
    try:
        d = object.__getattribute__(obj, "__dict__")
    except Exception:
        return None
    return d if type(d) is dict else None


def slot_items(obj: Any) -> Iterator[tuple[str, Any]]:
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


def inner_value(obj: Any, name: str) -> Any:
    """A tensor subclass's inner by name: from ``__dict__``, else from a slot (``DTensor._local_tensor``)."""
    d = instance_dict(obj)
    if d is not None and name in d:
        return d[name]
    for klass in type(obj).__mro__:
        desc = klass.__dict__.get(name)
        if type(desc) is types.MemberDescriptorType:
            try:
                return desc.__get__(obj, type(obj))
            except AttributeError:
                return None
    return None


_PARTIAL_FUNC = functools.partial.__dict__["func"]
_PARTIAL_ARGS = functools.partial.__dict__["args"]
_PARTIAL_KW = functools.partial.__dict__["keywords"]
_FN_CLOSURE: Any = types.FunctionType.__dict__["__closure__"]
_FN_CODE: Any = types.FunctionType.__dict__["__code__"]
_FN_DEFAULTS: Any = types.FunctionType.__dict__["__defaults__"]
_FN_KWDEFAULTS: Any = types.FunctionType.__dict__["__kwdefaults__"]


def members(v: Any, k: int) -> list[tuple[Any, Any, str, Any]]:
    """Children of a set, deque, ``functools.partial`` or function as ``(key, value, slot, owner)``, read through
    the builtin types' own methods and descriptors (never the object's Python-level overrides)."""
    out: list[tuple[Any, Any, str, Any]] = []
    if k == SET:
        it = set.__iter__(v) if isinstance(v, set) else frozenset.__iter__(v)
        out.extend((i, x, "member", v) for i, x in enumerate(it))
    elif k == DEQUE:
        out.extend((i, x, "item", v) for i, x in enumerate(collections.deque.__iter__(v)))
    elif k == PARTIAL:
        out.append(("func", _PARTIAL_FUNC.__get__(v), "func", v))
        out.extend((f"args.{i}", x, "arg", v) for i, x in enumerate(_PARTIAL_ARGS.__get__(v)))
        kw = _PARTIAL_KW.__get__(v)
        if type(kw) is dict and kw:
            out.append(("keywords", kw, "attr", v))
    elif k == FUNC:
        cells = _FN_CLOSURE.__get__(v)
        if cells:
            names = _FN_CODE.__get__(v).co_freevars
            for name, cell in zip(names, cells):
                try:
                    out.append((f"__closure__.{name}", cell.cell_contents, "cell", cell))
                except ValueError:  # an empty cell: the variable is not bound yet
                    continue
        defaults = _FN_DEFAULTS.__get__(v)
        if defaults:
            out.extend((f"__defaults__.{i}", x, "default", v) for i, x in enumerate(defaults))
        kwd = _FN_KWDEFAULTS.__get__(v)
        if type(kwd) is dict and kwd:
            out.append(("__kwdefaults__", kwd, "attr", v))
    return out


def has_members(v: Any, k: int) -> bool:
    """Cheap test before any bookkeeping: most functions on modules close over nothing."""
    if k != FUNC:
        return True
    return bool(_FN_CLOSURE.__get__(v) or _FN_DEFAULTS.__get__(v)
                or _FN_KWDEFAULTS.__get__(v))  # type: ignore[attr-defined]


# -- tensors -------------------------------------------------------------------------------------------------------


def form_of(t: torch.Tensor) -> str:
    """The tensor's form: ``dense``, ``nested``, ``sparse``, ``quantized``, ``dtensor`` or ``subclass``.

    >>> form_of(torch.zeros(2)), form_of(torch.zeros(2, 2).to_sparse())
    ('dense', 'sparse')
    """
    tp = type(t)
    if tp is not torch.Tensor and tp is not nn.Parameter:
        if is_jagged_type(tp):
            return "nested"
        if tp.__name__ == "DTensor" and (tp.__module__ or "").startswith("torch.distributed"):
            return "dtensor"
    if t.is_nested:
        return "nested"
    if t.layout != torch.strided:
        return "sparse"
    if t.is_quantized:
        return "quantized"
    return "dense" if tp is torch.Tensor or tp is nn.Parameter else "subclass"


def describe(t: torch.Tensor) -> tuple[tuple[int, ...], int]:
    """``(shape, nbytes)`` for any tensor form: ragged dimensions of nested tensors are ``-1``; sparse tensors
    count their indices and values."""
    try:
        shape: tuple[int, ...] = tuple(d if type(d) is int else -1 for d in t.shape)
    except Exception:
        shape = _nested_shape(t)
    try:
        nbytes = int(t.nbytes)
    except Exception:
        nbytes = _sparse_nbytes(t)
    return shape, nbytes


def _nested_shape(t: torch.Tensor) -> tuple[int, ...]:
    try:
        rows = t._nested_tensor_size().tolist()  # one row of sizes per component
    except Exception:
        return ()
    if not rows:
        return (0,)
    cols = list(zip(*rows))
    return (len(rows), *(c[0] if all(x == c[0] for x in c) else -1 for c in cols))


def _sparse_nbytes(t: torch.Tensor) -> int:
    try:
        return int(t._indices().nbytes + t._values().nbytes)  # COO: nbytes refuses, its parts do not
    except Exception:
        try:
            return int(t.numel() * t.element_size())
        except Exception:
            return 0


def unreadable(t: torch.Tensor) -> str | None:
    """Why a tensor of an unusual class cannot be described (its ``device``, ``dtype`` or shape raise), or None."""
    try:
        t.device  # noqa: B018  # the verbs read these: a class where they raise is reported, not handed on
        t.dtype  # noqa: B018
        t.is_floating_point()
        describe(t)
    except Exception as exc:
        return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
    return None


def hook_chain(hook: Any) -> list[Any]:
    """An accelerate hook, each hook of a ``SequentialHook``, or each hook of a diffusers ``HookRegistry`` (read
    from ``__dict__``, no user code run)."""
    hd = instance_dict(hook) or {}
    inner = hd.get("hooks")
    if isinstance(inner, (list, tuple)):
        return [h for h in inner]
    if isinstance(inner, dict):
        return list(inner.values())
    return [hook]


def group_offloading(registry: Any) -> bool:
    """A diffusers ``HookRegistry`` holding a group offloading hook (``apply_group_offloading``,
    ``enable_group_offload``): the module rests on the offload device and is onloaded per call."""
    if registry is None:
        return False
    inner = (instance_dict(registry) or {}).get("hooks")
    return isinstance(inner, dict) and any(type(h).__name__ == "GroupOffloadingHook" for h in inner.values())


SCRIPTED: dict[type, bool] = {}  # module class -> a TorchScript module (scripted or traced)


def is_script(tp: type) -> bool:
    """Whether a module class is TorchScript's (remembered per class in ``SCRIPTED``)."""
    got = SCRIPTED[tp] = issubclass(tp, torch.jit.ScriptModule)
    return got


def script_dict(mod: nn.Module) -> dict[str, Any]:
    """A TorchScript module's parameters, buffers and submodules as the plain dicts an ``nn.Module`` keeps: its
    ``__dict__`` holds C++-backed wrappers (a traced model's top holds none and forwards to its script module).
    Read through torch's own wrappers, whose ``items`` run no user code; its other attributes live in C++."""
    out: dict[str, Any] = {}
    for store in ("_parameters", "_buffers", "_modules"):
        try:
            out[store] = {k: v for k, v in getattr(mod, store).items() if v is not None}
        except Exception:  # a wrapper torch changed: nothing to read rather than a crash
            out[store] = {}
    return out


# nn.Module bookkeeping: never user data (skipping these by a frozen set is what makes the walk cost about a bare named_parameters() loop).
_MODULE_INTERNALS = frozenset(nn.Module().__dict__) | {"_hf_hook", "_old_forward", "forward", "__dict__",
                                                       "_diffusers_hook"}
# per class: [(keys, extra, hooked, forward, script, order, forward hooks both ways, _parameters, _buffers, _modules,
# compiled, plain)]; ``order`` is the keys in one instance's insertion order; the next four say which of the module's
# dicts exist (read with a subscript where the keys matched); ``compiled``: torch.compile's wrapper (its paths are the
# model's); ``plain``: none of the hook keys, no instance ``forward``, not TorchScript or compiled, all three dicts
_ATTR_KEYS: dict[type, list[Any]] = {}
NO_KEYS: Any = (frozenset({"<none>"}), (), False, False, False, (), False, False, False, False, False,
                False)  # no dict's keys


def class_keys(tp: type, d: dict[str, Any]) -> Any:
    """The key set of a module's ``__dict__`` and what follows from it, remembered per class. A class may have a
    few key sets (a Linear some library tagged, a ResNet block with or without a shortcut): every one is kept, so
    instances that alternate between them never rebuild one (Flux: 76 rebuilds per walk with one slot per class).
    Each is also kept in one instance's insertion order: the walker compares ``tuple(d)`` with it (a tuple of the
    same interned names compares by identity, about half the cost of comparing a keys view with a set), and a
    key set met in another order gets a variant in that order."""
    known = _ATTR_KEYS.get(tp)
    order = tuple(d)
    if known is not None:
        for hit in known:
            if order == hit[5]:
                return hit
        for hit in known:
            if d.keys() == hit[0]:
                variant = hit[:5] + (order,) + hit[6:]
                if len(known) < 8:
                    known.append(variant)
                return variant
    elif len(_ATTR_KEYS) > 4096:  # fx GraphModules make a class per instance
        _ATTR_KEYS.clear()
    keys = frozenset(d)
    script = is_script(tp)  # its attributes live in C++: none walked
    hit = (keys, () if script else tuple(sorted(keys - _MODULE_INTERNALS)),
           not script and ("_hf_hook" in keys or "_diffusers_hook" in keys), not script and "forward" in keys, script,
           order, "_forward_hooks" in keys and "_forward_pre_hooks" in keys, script or "_parameters" in keys,
           script or "_buffers" in keys, script or "_modules" in keys, tp.__name__ == "OptimizedModule")
    hit += (not hit[2] and not hit[3] and not script and hit[7] and hit[8] and hit[9] and not hit[10],)
    if known is None or len(known) >= 8:  # a class whose instances all differ: the newest few
        known = _ATTR_KEYS[tp] = []
    known.append(hit)
    return hit
