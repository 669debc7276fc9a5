"""What apps do on purpose, recognised by mechanism (read from the objects and their classes' code, never run).

- a module whose own forward moves or casts its tensors on each call (``percall``: ComfyUI ``comfy.ops`` cast
  layers and lowvram partial loading, InvokeAI's autocast layers, Forge's operations, transformers' rotary
  embeddings): those tensors may rest anywhere (and, when cast, in any dtype);
- a module without a forward of its own that holds buffers (ComfyUI ``model_sampling``: ``sigmas``,
  ``log_sigmas``): schedule tables read by its methods, kept float32 outside the denoiser's forward;
- a tensor held under a backup name, shaped like one of its module's parameters or buffers, that the module's code
  never reads (SD.Next ``network_weights_backup``): a copy kept where the patcher put it;
- a tensor of a plain object that an app's documented convention keeps elsewhere (``conventions.TABLE``).

``intended_at(module, name, tensor, role)`` is the one answer per tensor, for scan's policy and virtual runs alike.
Everything is read per class and cached. See docs/policy.md.
"""

from __future__ import annotations

import re
import types
from itertools import compress
from operator import itemgetter
from typing import Any

import torch
from torch import nn

from torchdoctor._scan import percall
from torchdoctor._scan.conventions import BACKUP_NAME, TABLE
from torchdoctor._walk import Entry

_MODULE = itemgetter(1)  # a (path, module) pair's module

_READS: dict[type, frozenset[str]] = {}  # class -> every attribute name its code reads
_TABLES: dict[type, bool] = {}  # class -> no forward of its own
_NO_FORWARD = nn.Module.forward


def _code_names(fn: Any) -> set[str]:
    code = getattr(fn, "__code__", None)
    out: set[str] = set()
    stack = [code] if isinstance(code, types.CodeType) else []
    while stack:
        c = stack.pop()
        out.update(c.co_names)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return out


def _torch_own(klass: type) -> bool:
    return klass is nn.Module or klass is object or (klass.__module__ or "").startswith("torch.")


def cast_conditions(tp: type) -> tuple[str, ...] | None:
    """For a module class whose forward casts or moves its own tensors per call: the instance attributes that switch
    it on (ComfyUI ``comfy_cast_weights``, ``weight_function``; InvokeAI ``_device_autocasting_enabled``), ``()``
    when it always does, None when its forward never does (torch's own layers, ordinary model code). Read by
    ``percall.plan``."""
    p = percall.plan(tp)
    if p is None:
        return None
    always, branches = p
    if always:
        return ()
    return tuple(dict.fromkeys(n for names, _, _ in branches for n in names))


def casts_per_call(module: nn.Module) -> bool:
    """This module's own forward casts or moves its weights to the input's dtype and device on this call."""
    return percall.moved_on_call(module).get("weight", 0) == percall.DEVICE | percall.DTYPE


def schedule_table(module: nn.Module | None) -> bool:
    """A module class without a forward of its own whose methods read its buffers (ComfyUI ``model_sampling``:
    ``sigma()`` reads ``sigmas``): tables in the precision they were made in, never a layer's weights. A bare
    ``nn.Module`` holding a buffer is not one."""
    if module is None:
        return False
    tp = type(module)
    hit = _TABLES.get(tp)
    if hit is None:
        hit = _TABLES[tp] = getattr(tp, "forward", None) is _NO_FORWARD and not _torch_own(tp)
    if not hit:
        return False
    buffers = module.__dict__.get("_buffers") or {}
    return bool(buffers) and any(name in _method_reads(tp) for name in buffers)


_METHOD_READS: dict[type, frozenset[str]] = {}


def _method_reads(tp: type) -> frozenset[str]:
    """Attribute names the class's own methods (not ``__init__``, not torch's) read."""
    hit = _METHOD_READS.get(tp)
    if hit is None:
        names: set[str] = set()
        for klass in tp.__mro__:
            if _torch_own(klass):
                continue
            for key, v in klass.__dict__.items():
                if key != "__init__":
                    names |= _code_names(v.fget if isinstance(v, property) else getattr(v, "__func__", v))
        hit = _METHOD_READS[tp] = frozenset(names)
    return hit


def reads(tp: type) -> frozenset[str]:
    """Every attribute name the code of a module class (and its bases) reads."""
    hit = _READS.get(tp)
    if hit is None:
        names: set[str] = set()
        for klass in tp.__mro__:
            if klass is object or klass is nn.Module:
                continue
            for v in klass.__dict__.values():
                names |= _code_names(v.fget if isinstance(v, property) else getattr(v, "__func__", v))
        hit = _READS[tp] = frozenset(names)
    return hit


def backup_copy(e: Entry) -> bool:
    """A tensor a module holds under a name marked as a saved copy (``conventions.BACKUP_NAME``), directly or in a
    container, shaped like one of the module's parameters or buffers, that the module's code never reads: a copy a
    LoRA patcher keeps to restore the weight (SD.Next ``network_weights_backup``, ``sdnq_scale_backup``). An unread
    attribute with another name may still be read by a parent's code."""
    mod = e.module
    if mod is None or e.role not in ("attribute", "container"):
        return False
    name = _name_on(e)
    return name is not None and backup_named(mod, name, e.tensor)


def backup_named(module: nn.Module, name: str, tensor: torch.Tensor) -> bool:
    """``backup_copy`` for a tensor ``module`` holds as (or under) attribute ``name``."""
    if not re.search(BACKUP_NAME, name) or name in reads(type(module)):
        return False
    d = module.__dict__
    shape = tensor.shape
    return any(isinstance(p, torch.Tensor) and p.shape == shape
               for p in (*(d.get("_parameters") or {}).values(), *(d.get("_buffers") or {}).values()))


def backup_path(path: str) -> bool:
    """A tensor of a plain object kept under a name marked as a saved copy (a patcher's ``backup`` dict): where the
    patcher keeps it (the offload device, the dtype it was saved in) is its design."""
    return any(re.search(BACKUP_NAME, part) for part in path.split(".")[:-1])


def convention(e: Entry) -> str | None:
    """The app whose convention keeps this tensor of a plain object where it is (``conventions.TABLE``), if any."""
    if e.module is not None:
        return None
    parts = set(e.path.split("."))
    return next((row.app for row in TABLE if row.attribute in parts), None)




def casting_modules(modules: list[tuple[str, nn.Module]], types_: set[type]) -> dict[int, dict[str, int]]:
    """Module id -> the tensors its own forward moves or casts on its next call (``percall.moved_on_call``), for
    the modules that move any (per class first: ordinary models have no such class, and then no module is looked
    at)."""
    plans = percall._PLANS
    todo = types_.difference(plans)  # at C speed, as the intersection below
    if todo:
        # only a class whose instances hold tensors of their own is read (a model's blocks and wrappers hold
        # none: their layers do), and each class once per process
        owning = {type(m) for _, m in modules if type(m) in todo and (
            m.__dict__.get("_parameters") or m.__dict__.get("_buffers"))}
        for tp in todo:
            if tp in owning:
                percall.plan(tp)
            else:
                plans[tp] = None
    classes = set(compress(types_, map(plans.get, types_)))  # a plan is a non-empty tuple
    if not classes:
        return {}
    out = {}
    # the modules of those classes picked at C speed (a model's one rotary embedding among all its layers)
    for _, m in compress(modules, map(classes.__contains__, map(type, map(_MODULE, modules)))):
        moved = percall.moved_on_call(m)
        if moved:
            out[id(m)] = moved
    return out


def module_casts(m: nn.Module) -> bool:
    """Whether ``casting_modules`` of a walk holding ``m`` holds it (``m`` holds tensors of its own), asked of that
    one module: its class's plan (made once per class), then what its forward moves on this call."""
    tp = type(m)
    plan = percall._PLANS[tp] if tp in percall._PLANS else percall.plan(tp)
    return plan is not None and bool(percall.moved_on_call(m))


def network_adapters(w: Any) -> tuple[dict[str, tuple[str, str]], dict[str, torch.device]]:
    """Tensors of forward-replacing LoRA networks as adapters of the module they patch: ``path -> (patched module
    path, network name)``, and the patched module's weight device (what the network must sit beside)."""
    of: dict[str, tuple[str, str]] = {}
    base: dict[str, torch.device] = {}
    if not w.patches:
        return of, base
    by_path = dict(w.modules)
    prefixes = {}
    for patched, mod, prefix in w.patches:
        weight = (mod.__dict__.get("_parameters") or {}).get("weight")
        if isinstance(weight, torch.Tensor):
            base[patched] = weight.device
        net = by_path.get(prefix)
        name = net.__dict__.get("lora_name") if net is not None else None
        prefixes[prefix + "."] = (patched, name if isinstance(name, str) else type(net).__name__)
    for e in w.entries:
        if e.alias_of is None and ".forward.__self__." in e.path:
            hit = next((v for p, v in prefixes.items() if e.path.startswith(p)), None)
            if hit is not None:
                of[e.path] = hit
    return of, base


def on_call(module: nn.Module, name: str, moves: dict[str, int] | None = None) -> int:
    """What the module's own forward changes of its tensor ``name`` on this call (``percall.DEVICE`` /
    ``percall.DTYPE`` bits; 0: nothing). ``moves``: ``casting_modules``' answer for the module, when known."""
    if moves is None:
        moves = percall.moved_on_call(module)
    return moves.get(name, 0)


def intended_at(module: nn.Module, name: str, tensor: torch.Tensor, role: str) -> tuple[str, int] | None:
    """The one answer for a tensor a module holds as ``name`` (a parameter, buffer or plain attribute; for a
    container, the attribute holding it): the mechanism that makes its place intended, as (rule, what may differ:
    ``percall`` bits), or None. scan's policy asks it per entry; a virtual run asks it when a module starts or an
    op reads the tensor, so both give the same answer for the same object."""
    bits = on_call(module, name)
    if bits:
        return ("casts-per-call" if bits & percall.DTYPE else "moved-per-call"), bits
    if role == "buffer" and schedule_table(module):
        return "schedule-table", percall.DEVICE | percall.DTYPE
    if role in ("attribute", "container") and backup_named(module, name, tensor):
        return "backup-copy", percall.DEVICE | percall.DTYPE
    if role == "attribute" and recomputed(module, name):
        return "casts-per-call", percall.DEVICE | percall.DTYPE
    return None


def recomputed(module: nn.Module, name: str) -> bool:
    """``name`` is recomputed by the module's own forward pre-hook at every call (``torch.nn.utils.weight_norm``:
    ``weight`` from ``weight_g`` and ``weight_v``, in their device and dtype): between calls it may be stale (a
    ``.to(float16)`` leaves it float32 until the next forward), and the stored tensors are the ones judged."""
    hooks = module.__dict__.get("_forward_pre_hooks")
    return isinstance(hooks, dict) and any(type(h).__name__ == "WeightNorm" and getattr(h, "name", None) == name
                                           for h in dict.values(hooks))


def intended(e: Entry, casting: dict[int, dict[str, int]], strict: bool) -> tuple[str, int] | None:
    """The app mechanism (or convention) that makes this tensor's place intended whatever the model's expectation,
    as (rule name, what may differ: ``percall`` bits), or None."""
    mod = e.module
    both = percall.DEVICE | percall.DTYPE
    if mod is not None:
        name = _name_on(e)
        if casting:
            moved = casting.get(id(mod))
            if moved is not None and name is not None:
                bits = moved.get(name, 0)
                if bits:
                    return ("casts-per-call" if bits & percall.DTYPE else "moved-per-call"), bits
        role = e.role
        if role == "buffer" and schedule_table(mod):
            return "schedule-table", both
        if role in ("attribute", "container") and backup_copy(e):
            return "backup-copy", both
        if role == "attribute" and e.owner is mod and isinstance(e.key, str) and recomputed(mod, e.key):
            return "casts-per-call", both  # weight_norm's weight, made from weight_g / weight_v at each call
        return None
    if backup_path(e.path):
        return "backup-copy", both
    return ("app-convention", both) if strict and convention(e) else None


def _name_on(e: Entry) -> str | None:
    """The attribute name under which the entry's module holds it (its first path segment below the module)."""
    if e.owner is e.module and isinstance(e.key, str):
        return e.key
    rel = e.path[len(e.module_path) + 1:] if e.module_path else e.path
    return rel.split(".", 1)[0] or None


__all__ = ["backup_copy", "backup_named", "backup_path", "cast_conditions", "casting_modules", "casts_per_call",
           "convention", "intended", "intended_at", "network_adapters", "on_call", "reads", "recomputed",
           "schedule_table"]
