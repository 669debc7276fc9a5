"""What apps do on purpose, recognised by mechanism (read from the objects and their classes' code, never run).

- a layer whose own forward casts or moves its weights on each call (ComfyUI ``comfy.ops``: ``manual_cast``,
  lowvram partial loading, ``weight_function`` patches): its weights may rest anywhere and in storage dtypes;
- a module without a forward of its own that holds buffers (ComfyUI ``model_sampling``: ``sigmas``,
  ``log_sigmas``): schedule tables read by its methods, kept float32 outside the denoiser's forward;
- a plain tensor attribute with the shape of one of its module's parameters that the module's code never reads
  (SD.Next ``network_weights_backup``): a backup copy, kept where the patcher put it;
- a tensor of a plain object that an app's documented convention keeps elsewhere (``conventions.TABLE``).

Everything is read per class and cached: the code objects' names first (no source read for ordinary classes),
the source of ``forward`` only when it mentions a cast. See docs/policy.md.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import types
from typing import Any

import torch
from torch import nn

from torchdoctor._scan.conventions import BACKUP_NAME, TABLE
from torchdoctor._walk import Entry

_CASTS: dict[type, tuple[str, ...] | None] = {}  # class -> attributes that switch per-call casting on (() = always)
_READS: dict[type, frozenset[str]] = {}  # class -> every attribute name its code reads
_TABLES: dict[type, bool] = {}  # class -> no forward of its own
_CAST_CALL = r"\b\w*cast\w*\(\s*self\b|self\.(?:weight|bias)\s*\.\s*to\("  # compiled by re at first use
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
    """For a module class whose forward casts or moves its weights per call: the instance attributes that switch
    it on (ComfyUI ``comfy_cast_weights``, ``weight_function``, ``bias_function``), ``()`` when it always does,
    None when its forward never does (torch's own layers, ordinary model code)."""
    if tp in _CASTS:
        return _CASTS[tp]
    _CASTS[tp] = None
    owner = next((k for k in tp.__mro__ if "forward" in k.__dict__), None)
    if owner is None or _torch_own(owner):
        return None
    fwd = owner.__dict__["forward"]
    names = _code_names(fwd)
    if not any("cast" in n for n in names) and not ({"to", "weight"} <= names):
        return None  # the cheap test: ordinary forwards never name a cast
    try:
        src = textwrap.dedent(inspect.getsource(fwd))
        tree = ast.parse(src)
    except (OSError, TypeError, SyntaxError):
        return None
    casting = {n for n in names if callable(inspect.getattr_static(tp, n, None)) and _casts_in(tp, n)}

    def casts(node: ast.AST) -> bool:
        seg = ast.get_source_segment(src, node) or ""
        return bool(re.search(_CAST_CALL, seg)) or any(
            isinstance(c, ast.Attribute) and isinstance(c.value, ast.Name) and c.value.id == "self"
            and c.attr in casting for c in ast.walk(node))

    fn = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if fn is None:
        return None
    conds: list[str] = []
    for stmt in fn.body:
        if isinstance(stmt, ast.If) and any(casts(s) for s in stmt.body):
            conds.extend(n.attr for n in ast.walk(stmt.test) if isinstance(n, ast.Attribute)
                         and isinstance(n.value, ast.Name) and n.value.id == "self")
        elif not isinstance(stmt, ast.If) and casts(stmt):
            _CASTS[tp] = ()
            return ()
    _CASTS[tp] = tuple(dict.fromkeys(conds)) if conds else None
    return _CASTS[tp]


def _casts_in(tp: type, name: str) -> bool:
    fn = inspect.getattr_static(tp, name, None)
    if not isinstance(fn, types.FunctionType):
        return False
    try:
        return bool(re.search(_CAST_CALL, inspect.getsource(fn)))
    except (OSError, TypeError):
        return False


def casts_per_call(module: nn.Module) -> bool:
    """This module's own forward casts or moves its weights to the input's dtype and device on this call."""
    conds = cast_conditions(type(module))
    if conds is None:
        return False
    if not conds:
        return True
    for name in conds:
        v = inspect.getattr_static(module, name, None)
        if isinstance(v, (bool, int, list, tuple, dict)) and v:
            return True
    return False


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
    """A plain tensor attribute named as a saved copy (``conventions.BACKUP_NAME``), shaped like one of its module's
    parameters, that the module's code never reads: a copy a LoRA patcher keeps to restore the weight (SD.Next
    ``network_weights_backup``). An unread attribute with another name may still be read by a parent's code."""
    mod, key, t = e.module, e.key, e.tensor
    if mod is None or e.owner is not mod or not isinstance(key, str) or not re.search(BACKUP_NAME, key) \
            or key in reads(type(mod)):
        return False
    shape = t.shape
    return any(isinstance(p, torch.Tensor) and p.shape == shape for p in (mod.__dict__.get("_parameters") or {}).values())


def convention(e: Entry) -> str | None:
    """The app whose convention keeps this tensor of a plain object where it is (``conventions.TABLE``), if any."""
    if e.module is not None:
        return None
    parts = set(e.path.split("."))
    return next((row.app for row in TABLE if row.attribute in parts), None)




def casting_modules(modules: list[tuple[str, nn.Module]], types_: set[type]) -> set[int]:
    """ids of the modules that cast or move their own weights on their next call (per class first: ordinary
    models have no casting class, and then no module is looked at)."""
    cache = _CASTS
    classes = {tp for tp in types_ if (cache[tp] if tp in cache else cast_conditions(tp)) is not None}
    if not classes:
        return set()
    return {id(m) for _, m in modules if type(m) in classes and casts_per_call(m)}


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


def intended(e: Entry, casting: set[int], strict: bool) -> str | None:
    """The app mechanism (or convention) that makes this tensor's place intended whatever the model's expectation,
    as a rule name, or None."""
    mod = e.module
    if mod is not None:
        if casting and id(mod) in casting:
            return "casts-per-call"
        role = e.role
        if role == "buffer" and schedule_table(mod):
            return "schedule-table"
        if role == "attribute" and backup_copy(e):
            return "backup-copy"
        return None
    return "app-convention" if strict and convention(e) else None


__all__ = ["backup_copy", "cast_conditions", "casting_modules", "casts_per_call", "convention", "intended",
           "network_adapters", "reads", "schedule_table"]
