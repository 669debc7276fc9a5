"""Buffers a model-wide cast rounded: a buffer the module computes when it is built (non-persistent, never loaded)
and its own forward casts up to float32 on every call (transformers' rotary embeddings:
``self.inv_freq.to(device=x.device, dtype=torch.float)``; a user's ``self.inv_freq.float()``) is meant to hold
float32 values. ``model.to(torch.bfloat16)`` / ``.half()`` casts every floating buffer, so it now holds rounded
values, and the per-call upcast cannot bring the lost digits back (long positions get the wrong angles).
``from_pretrained(dtype=...)`` builds it in float32 and keeps it so: a float32 one is quiet. The model still runs,
so this is a note (``report.extra["notes"]``: problem records that leave ``ok`` alone), not a problem.

Read from the forward's parsed code (``percall``'s reader), per class, never run. The fix (rebuild the values) is
proven when the module, holding no layers or weights, can be built again from its own ``config`` (transformers'
classes): the rebuilt buffer is float32 and rounds to exactly the stored values; else it is printed as unproven.
"""

from __future__ import annotations

import ast
import logging
import types
from typing import Any

import torch
from torch import nn

from torchdoctor._placement import dtype_str
from torchdoctor._report.model import Problem
from torchdoctor._scan import percall

log = logging.getLogger("torchdoctor.scan")

_WIDE = ("float", "double")  # ``.float()`` / ``.double()``
_WIDE_DTYPES = frozenset({"torch.float", "torch.float32", "torch.double", "torch.float64"})
_UPCAST: dict[type, frozenset[str]] = {}  # class -> the own tensors its forward casts up to float32 or wider


def upcast_at_use(tp: type) -> frozenset[str]:
    """The names of the module's own tensors the forward of class ``tp`` (and the function a decorator wraps) casts
    to float32 or float64 on every call: ``self.x.float()``, ``self.x.to(torch.float32)``,
    ``self.x.to(device=..., dtype=torch.float)``, also through an index or a local bound to it."""
    hit = _UPCAST.get(tp)
    if hit is not None:
        return hit
    if len(_UPCAST) > 4096:  # fx GraphModules make a class per instance
        _UPCAST.clear()
    try:
        hit = _UPCAST[tp] = _read(tp)
    except Exception:  # code the reader does not follow: nothing known, never a crash
        log.debug("reading %s's forward failed", tp.__name__, exc_info=True)
        hit = _UPCAST[tp] = frozenset()
    return hit


def _read(tp: type) -> frozenset[str]:
    found: set[str] = set()
    owner = next((k for k in tp.__mro__ if "forward" in k.__dict__), None)
    fwd = owner.__dict__["forward"] if owner is not None and not percall._torch_own(owner) else None
    fns = [fwd, getattr(fwd, "__wrapped__", None)] if isinstance(fwd, types.FunctionType) else []
    for fn in fns:
        if not isinstance(fn, types.FunctionType) or not percall._names(fn) & {"float", "double", "to", "type"}:
            continue
        node = percall._tree(fn)
        if node is None:
            continue
        params = fn.__code__.co_varnames[:1]
        me = params[0] if params else "self"
        reader = percall._Reader(tp)
        alias: dict[str, str] = {}
        nodes = percall._nodes(node)
        for n in nodes:  # local names bound to one of the module's tensors (``f = self.inv_freq[None]``)
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
                a = reader._attr(n.value, me, alias)
                if a is not None:
                    alias[n.targets[0].id] = a
        for n in nodes:
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and _widens(n):
                a = reader._attr(n.func.value, me, alias)
                if a is not None:
                    found.add(a)
    return frozenset(found)


def _widens(n: ast.Call) -> bool:
    name = n.func.attr if isinstance(n.func, ast.Attribute) else ""
    if name in _WIDE:
        return not n.args and not n.keywords
    if name in ("to", "type"):
        dtype = next((k.value for k in n.keywords if k.arg == "dtype"), None)
        if dtype is None:
            dtype = next((a for a in n.args if ast.unparse(a).startswith("torch.")), None)
        return dtype is not None and ast.unparse(dtype) in _WIDE_DTYPES
    return False


def rounded_notes(policy: Any) -> list[Problem]:
    """A ``dtype`` note for each computed buffer in bfloat16/float16 that its module's forward upcasts to float32
    on every call (see the module docstring)."""
    out: list[Problem] = []
    casting = policy.casting  # module id -> what its forward moves or casts per call (``percall``): a superset
    for e in policy.computed16:  # the non-persistent 16-bit buffers the policy's pass found (canonical ones only)
        if id(e.module) in casting and e.key in upcast_at_use(type(e.module)):
            out.append(_problem(e, e.tensor.dtype, policy.subject))
    return out


def _problem(e: Any, dt: torch.dtype, subject: Any) -> Problem:
    found, mod = dtype_str(dt), e.module
    c = e.info().compact
    root = "model" if isinstance(subject, nn.Module) else "obj"
    owner = f"{root}.{e.module_path}" if e.module_path else root
    if mod.__dict__.get("config") is not None:  # transformers' classes: built again from the config
        fix = (f"load the model in {found} instead of casting it after (from_pretrained(..., dtype=torch.{found}) "
               f"keeps it float32), or rebuild it after the cast: {owner}.{e.key} = "
               f"type({owner})({owner}.config).{e.key}.to({owner}.{e.key}.device)")
    else:
        fix = (f"keep it float32 through the cast: copy = {owner}.{e.key}.clone() before the cast, then "
               f"{owner}.{e.key} = copy after it (or compute it again in float32 after the cast)")
    proof = _prove(mod, e.key, e.tensor)
    msg = (f"{c} is {found}, but {type(mod).__name__}'s own forward computes with it in float32 on every call: it "
           f"is computed in float32 when the module is built (not loaded from a checkpoint), and a model-wide cast "
           f"(.to(torch.{found}), .half()) rounded its values, which the per-call upcast cannot restore (rotary "
           f"angles drift at long positions). Fix: {fix} ({proof})")
    return Problem("dtype", e.path, e.role, found, "float32", msg, None, e.module_path, type(mod).__name__, (c,))


def _prove(mod: nn.Module, key: str, t: torch.Tensor) -> str:
    """Rebuild the module from its own config on the CPU and check that its float32 buffer rounds to exactly the
    stored one: then the rebuilt values are the ones the cast rounded."""
    config = mod.__dict__.get("config")
    if mod.__dict__.get("_parameters") or mod.__dict__.get("_modules"):  # built again only when small (a rotary)
        return "fix unproven: the module holds layers or weights, so it was not built again to compare"
    if config is None:
        return "fix unproven: restoring a float32 copy keeps what it held; no float32 copy is left to compare with"
    if type(t) is not torch.Tensor and type(t) is not nn.Parameter:  # a virtual run's tensor: nothing to read
        return "fix unproven: the buffer's values cannot be read here"
    if t.device.type == "meta":
        return "fix unproven: the buffer is on meta, there are no values to compare"
    try:
        with torch.device("cpu"), torch.no_grad():
            fresh = type(mod)(config)
        new = fresh.__dict__.get("_buffers", {}).get(key)
        if isinstance(new, torch.Tensor) and new.dtype == torch.float32 and new.shape == t.shape and torch.equal(
                new.to(t.dtype), t.detach().to("cpu")):
            return (f"fix proven: a {type(mod).__name__} rebuilt from its config holds it in float32, and those "
                    f"values round to exactly the stored ones")
        what = "differ from the stored ones" if isinstance(new, torch.Tensor) else "hold no such buffer"
    except Exception as exc:  # a constructor that wants more than its config
        log.debug("rebuilding %s failed", type(mod).__name__, exc_info=True)
        what = f"could not be built ({type(exc).__name__})"
    return f"fix unproven: a {type(mod).__name__} rebuilt from its config {what}"


__all__ = ["rounded_notes", "upcast_at_use"]
