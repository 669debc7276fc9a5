"""Module-entry checks of a virtual run: when a module's forward starts, every tensor it owns must sit where it
computes, whatever kernel path runs later.

A single-row bitsandbytes 4-bit input takes ``gemv_4bit``, which reads ``quant_state.code``; a two-row input
dequantizes without it — so a ``quant_state.code`` left on another device is invisible to op-level checks on one
path and a crash on the other. Owned tensors are the module's parameters and buffers, what hangs off them
(``weight.quant_state`` and its nested state, 8-bit ``CB``/``SCB``), its plain tensor attributes and containers
(a list still holding buffers ``.to()`` replaced), ``ParameterDict``/``ParameterList`` children (never called, so
never entered) and modules kept in plain lists. They are found by the one walker, each module checked once per
placement change.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from torchdoctor._placement import compact, device_str, norm_device, tensor_device
from torchdoctor._scan import intent
from torchdoctor._scan.judge import cpu_packed_message
from torchdoctor._virtual.tensor import VirtualTensor, current_space
from torchdoctor._walk import walk

_SKIP = frozenset(nn.Module().__dict__) | {"_hf_hook", "_old_forward", "forward", "config", "generation_config",
                                           "_diffusers_hook"}
_HOLDERS = (nn.ParameterDict, nn.ParameterList)
_CODE = (types.FunctionType, types.MethodType, types.BuiltinFunctionType, functools.partial)


def owned(mod: nn.Module) -> list[tuple[str, torch.Tensor, str]]:
    """(path relative to ``mod``, tensor, role) of what ``mod`` itself owns (not its called submodules)."""
    d = mod.__dict__
    holder: dict[str, Any] = {}
    holder.update(d.get("_parameters") or {})
    buffers = d.get("_buffers") or {}
    holder.update(buffers)
    for k, v in (d.get("_modules") or {}).items():
        if isinstance(v, _HOLDERS):
            holder[k] = v
    for k, v in d.items():
        if k not in _SKIP and not k.startswith("__") and not isinstance(v, (nn.Module, *_CODE)):
            holder[k] = v  # code (a wrapped ``to`` left by accelerate) is not data the forward reads
    best: dict[int, tuple[str, torch.Tensor, str]] = {}
    via_tensor = {k for k, v in holder.items() if isinstance(v, torch.Tensor)}
    for e in walk(holder).entries:  # canonical paths first; never through a module a tensor points back to
        parts = e.path.split(".", 2)
        if e.role == "offloaded" or id(e.tensor) in best or e.module is mod or intent.unused_quant_field(e) or (
                len(parts) > 2 and parts[0] in via_tensor and isinstance(getattr(holder[parts[0]], "__dict__", {})
                                                                         .get(parts[1]), nn.Module)):
            continue  # e.g. bitsandbytes' ``weight.module``: the layer itself again
        role = "parameter" if isinstance(e.tensor, nn.Parameter) else "buffer" if e.path in buffers else \
            "attribute" if e.path in d else e.role  # the walk saw a dict: name what the module holds directly
        best[id(e.tensor)] = (e.path, e.tensor, role)
    return list(best.values())


class EntryCheck:
    """Called by the module stack when a module starts; reports owned tensors off the module's compute device
    through ``note(kind, path, found, expected, message, op)``."""

    def __init__(self, device: torch.device, note: Callable[..., None], dispatched: Callable[[], bool]) -> None:
        self.device = device
        self.note = note
        self.dispatched = dispatched
        self.seen: dict[int, tuple[Any, ...]] = {}
        # path -> the note of a plain attribute / container tensor, written when an op reads it: a tensor the
        # forward never reads (Lightning's example_input_array, a loss history, an alias of a moved buffer) is quiet
        self.pending: dict[str, tuple[Any, ...]] = {}

    def __call__(self, mod: nn.Module, path: str, args: Any) -> None:
        if "_orig_mod" in mod.__dict__.get("_modules", ()):
            return  # a torch.compile wrapper: the module it wraps starts next and is checked then
        if "forward" in mod.__dict__:  # a hook wrapper (accelerate, diffusers group offloading / layerwise casting)
            return  # runs after this and may onload or cast the module's tensors; its ops are still checked
        key = _signature(mod)
        if self.seen.get(id(mod)) == key:
            return
        self.seen[id(mod)] = key
        tensors = owned(mod)
        if not tensors:
            return
        space = current_space()
        if space is not None:  # real tensors (a model built before the run) are lifted per op: name them
            for rel, t, _ in tensors:
                if not isinstance(t, VirtualTensor):
                    space.named[id(t)] = (t, f"{path}.{rel}" if path else rel)
        ref = self._reference(mod, tensors, args)
        if ref is None:
            return
        for rel, t, role in tensors:
            dev = norm_device(tensor_device(t))
            if role == "parameter" and dev.type not in ("cpu", "meta") and intent.cpu_packed(t):
                full = f"{path}.{rel}" if path else rel
                self.note("quant_incomplete", full, "cpu-packed", device_str(dev),
                          cpu_packed_message(full, device_str(dev)), f"{type(mod).__name__}.forward", role,
                          compact(t.dtype, tuple(t.shape), dev))
                continue
            if dev == ref or dev.type == "meta" or (dev.type == "cpu" and t.dim() == 0):
                continue
            name = rel.split(".", 1)[0]
            if role in ("attribute", "container") and not isinstance(mod.__dict__.get(name), _HOLDERS) \
                    and intent.self_managed(mod, name):
                continue  # the module's own code moves or rebuilds it before use
            full = f"{path}.{rel}" if path else rel
            note = ("device", full, device_str(dev), device_str(ref),
                    f"{full} {compact(t.dtype, tuple(t.shape), dev)} is on {device_str(dev)} when "
                    f"{path or '<root>'} ({type(mod).__name__}) starts on {device_str(ref)}: "
                    f"{_WHY.get(role, f'a {role} the forward reads')}", f"{type(mod).__name__}.forward", role,
                    compact(t.dtype, tuple(t.shape), dev))
            if role in ("attribute", "container"):
                self.pending[full] = note
            else:
                self.note(*note)
            if "_td_path" in dir(type(t)):  # a virtual twin: later ops name it where it was found, not where it was
                t._td_path = full  # type: ignore[attr-defined]  # lifted (a list still holding the buffer ``.to()`` replaced)

    def reached(self, tensors: list[Any]) -> None:
        """These tensors reached an op: a pending attribute / container among them is reported now."""
        for t in tensors:
            note = self.pending.pop(getattr(t, "_td_path", None) or "", None)
            if note is not None:
                self.note(*note)

    def _reference(self, mod: nn.Module, tensors: list[tuple[str, torch.Tensor, str]], args: Any) -> Any:
        """Where the module computes: the run's device when its input is there (and no accelerate hook spreads the
        model), else where most of its own floating weights are."""
        if not self.dispatched():
            x = next((a for a in (args if isinstance(args, tuple) else ()) if isinstance(a, torch.Tensor)), None)
            if x is not None and norm_device(tensor_device(x)) == self.device:
                return self.device
        counts: dict[torch.device, int] = {}
        for _, t, role in tensors:
            if role in ("parameter", "buffer") and t.is_floating_point():
                d = norm_device(tensor_device(t))
                counts[d] = counts.get(d, 0) + 1
        return max(counts, key=counts.__getitem__) if counts else None


_WHY = {  # why a tensor the module owns can sit elsewhere than the rest
    "parameter": "a parameter the forward reads (not moved with its input, or moved or replaced after the model's .to)",
    "buffer": "a buffer the forward reads (not moved with its input, or moved or replaced after the model's .to)",
    "attribute": "a plain tensor attribute the forward reads (Module.to moves parameters and buffers only)",
    "container": "a tensor in a list or dict the forward reads (Module.to moves parameters and buffers only)",
    "quant_state": "quantization state the kernel reads (Module.to moved the weight, not the state hanging off it)",
}


def _signature(mod: nn.Module) -> tuple[Any, ...]:
    """Cheap: changes when a parameter, buffer or attribute of ``mod`` is replaced or moved."""
    d = mod.__dict__
    sig: list[Any] = []
    for store in (d.get("_parameters") or {}, d.get("_buffers") or {}):
        for t in store.values():
            if t is not None:
                sig.append((id(t), getattr(t, "_td_device", None) or t.device))
    for k, v in d.items():
        if k not in _SKIP and not isinstance(v, nn.Module):
            sig.append((k, id(v), getattr(v, "_td_device", None) or getattr(v, "device", None)))
    return tuple(sig)
