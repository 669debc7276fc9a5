"""``torch.load`` in a virtual run: a checkpoint saved on a GPU (its storages tagged ``cuda:0``), or loaded with
``map_location="cuda"``, cannot make real storages on a device this machine lacks (torch raises ``Storage device
not recognized: cuda``). Every storage is read onto the CPU, and each tensor is then moved where the file or
``map_location`` puts it, by the run's own move: virtual where the device is virtual, real where it is the CPU, so a
resumed training program goes on (docs/architecture.md, _virtual)."""

from __future__ import annotations

from typing import Any

import torch

from torchdoctor._virtual.tensor import current_space, is_virtual


def install(installs: Any) -> None:
    installs.set(torch, "load", _load(torch.load))


def _target(map_location: Any, saved: str) -> Any:
    """Where ``map_location`` puts a storage saved at ``saved`` (a device, or None: leave it on the CPU)."""
    if map_location is None:
        return saved
    if isinstance(map_location, dict):
        return map_location.get(saved, saved)
    if isinstance(map_location, (str, torch.device)):
        return map_location
    return None  # a callable of the program's: it already ran on the CPU storage


def _load(original: Any) -> Any:
    def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        space = current_space()
        if space is None:
            return original(f, map_location, *args, **kwargs)
        where: dict[int, Any] = {}

        def to_cpu(storage: Any, location: str) -> Any:
            if callable(map_location) and not isinstance(map_location, (str, torch.device, dict)):
                out = map_location(storage, location)
                if out is not None and getattr(out, "device", torch.device("cpu")).type == "cpu":
                    return out
            dev = _target(map_location, location)
            if dev is not None:
                try:
                    dev = space.norm(dev)
                except (RuntimeError, TypeError, ValueError):
                    dev = None
            if dev is not None and is_virtual(dev):
                where[storage.data_ptr()] = dev
            return storage

        return _place(original(f, to_cpu, *args, **kwargs), where, set())

    load.__name__ = load.__qualname__ = "load"
    load.__doc__ = original.__doc__
    return load


def _place(obj: Any, where: dict[int, Any], seen: set[int]) -> Any:
    """Tensors of ``obj`` (dicts, lists, tuples, a module's state) moved to where their storage belongs."""
    if not where or id(obj) in seen:
        return obj
    if isinstance(obj, torch.Tensor):
        dev = where.get(obj.untyped_storage().data_ptr()) if obj.device.type == "cpu" else None
        if dev is None:
            return obj
        moved = obj.to(dev)
        return torch.nn.Parameter(moved, obj.requires_grad) if isinstance(obj, torch.nn.Parameter) else moved
    if isinstance(obj, torch.nn.Module):
        seen.add(id(obj))
        dev = next(iter(where.values()))
        return obj.to(dev)
    if isinstance(obj, dict):
        seen.add(id(obj))
        for k in list(obj):
            obj[k] = _place(obj[k], where, seen)
        return obj
    if isinstance(obj, list):
        seen.add(id(obj))
        obj[:] = [_place(x, where, seen) for x in obj]
        return obj
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_place(x, where, seen) for x in obj)
    return obj
