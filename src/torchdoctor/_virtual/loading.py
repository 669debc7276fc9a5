"""``torch.load`` in a virtual run: a checkpoint saved on a GPU (its storages tagged ``cuda:0``), or loaded with
``map_location="cuda"``, cannot make real storages on a device this machine lacks (torch raises ``Storage device
not recognized: cuda``). Every storage is read onto the CPU, and each tensor is then moved where the file or
``map_location`` puts it, by the run's own move: virtual where the device is virtual, real where it is the CPU, so a
resumed training program goes on (docs/architecture.md, _virtual). A file the run itself wrote from virtual
tensors holds CPU tensors (it loads anywhere), but read back in the run without ``map_location`` its tensors come
back on the devices they were saved from, where a GPU machine's ``torch.load`` puts them."""

from __future__ import annotations

import os
import pickle
import weakref
from typing import Any

import torch

from torchdoctor._virtual.tensor import VirtualTensor, current_space, host_values, is_virtual


def install(installs: Any) -> None:
    from torchdoctor._virtual import loaded

    loaded.clear()  # the loads and optimizer state loads on record are this run's
    installs.set(torch, "load", _load(torch.load))
    installs.set(torch, "save", _save(torch.save))
    installs.set(torch.optim.Optimizer, "load_state_dict", _state_load(torch.optim.Optimizer.load_state_dict))


def _state_load(original: Any) -> Any:
    """``Optimizer.load_state_dict`` whose line is remembered: a param_group value it leaves as loaded is said so."""
    def load_state_dict(self: Any, state_dict: Any) -> Any:
        from torchdoctor._virtual.loaded import state_loaded

        state_loaded(self)
        return original(self, state_dict)

    load_state_dict.__name__ = load_state_dict.__qualname__ = "load_state_dict"
    load_state_dict.__doc__ = original.__doc__
    return load_state_dict


def _file_key(f: Any) -> Any:
    """The file a save wrote and a load reads: a path as written, or the buffer object itself (its id and type: the
    entry is dropped when a save finds another object at that id)."""
    if isinstance(f, (str, os.PathLike)):
        return os.path.abspath(os.fspath(f))
    return (id(f), type(f))


def _written(space: Any, f: Any) -> list[Any] | None:
    entry = space.__dict__.get("_td_saved_files", {}).get(_file_key(f))
    if entry is None or entry[1] is not None and entry[1]() is not f:
        return None
    return entry[0]  # type: ignore[no-any-return]


class _Recorder(pickle.Pickler):
    """torch.save's pickler base in a run: the device of each distinct storage, in the order torch numbers them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.td_order: dict[int, Any] = {}
        self.td_keep: list[Any] = []

    def reducer_override(self, obj: Any) -> Any:
        if not isinstance(obj, torch.Tensor):
            return NotImplemented
        if isinstance(obj, VirtualTensor):
            with torch._C.DisableTorchFunction():
                host = host_values(obj)
            self.td_keep.append(host)  # alive until the save ends: its storage's address names it
            self.td_order.setdefault(host.untyped_storage()._cdata, obj._td_device)
            return host.__reduce_ex__(2)
        with torch._C.DisableTorchFunction():
            if obj.device.type == "cpu" and obj.layout == torch.strided:
                self.td_order.setdefault(obj.untyped_storage()._cdata, None)
        return NotImplemented


class _Pickle:
    """A pickle module whose Pickler records (the rest is the standard library's)."""

    def __init__(self) -> None:
        self.made: list[_Recorder] = []
        recorded = self.made

        class Pickler(_Recorder):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                recorded.append(self)

        self.Pickler = Pickler

    def __getattr__(self, name: str) -> Any:
        return getattr(pickle, name)


def _save(original: Any) -> Any:
    def save(obj: Any, f: Any, pickle_module: Any = pickle, *args: Any, **kwargs: Any) -> Any:
        space = current_space()
        if space is None or pickle_module is not pickle:
            return original(obj, f, pickle_module, *args, **kwargs)
        module = _Pickle()
        out = original(obj, f, module, *args, **kwargs)
        devices = [d for p in module.made for d in p.td_order.values()]
        saved = space.__dict__.setdefault("_td_saved_files", {})
        alive: Any
        try:
            alive = None if isinstance(f, (str, os.PathLike)) else weakref.ref(f)
        except TypeError:  # an object that takes no weak reference: not read back as saved
            alive = lambda: None  # noqa: E731
        saved[_file_key(f)] = (devices if any(d is not None for d in devices) else None, alive)
        return out

    save.__name__ = save.__qualname__ = "save"
    save.__doc__ = original.__doc__
    return save


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
        from torchdoctor._virtual.loaded import REMAP, remap

        if REMAP:  # a proof's re-run of the fix map_location= at this line
            map_location = remap(map_location)
        where: dict[int, Any] = {}
        written = _written(space, f) if map_location is None else None
        order: list[Any] = []

        def to_cpu(storage: Any, location: str) -> Any:
            if written is not None:  # written by this run from device tensors: their devices, in torch's order
                order.append(storage)
                return storage
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
                _exists(dev)
                where[storage.data_ptr()] = dev
            return storage

        start = _position(f)
        try:
            out = original(f, to_cpu, *args, **kwargs)
        except RuntimeError as exc:  # storages for a GPU the machine lacks: the fix's load tried on the same file
            if str(exc).startswith(DESERIALIZE):
                exc.td_mapped = _mapped(original, f, start, args, kwargs)  # type: ignore[attr-defined]
            raise
        if written is not None and len(order) == len(written):
            where.update((st.data_ptr(), dev) for st, dev in zip(order, written) if dev is not None)
        out = _place(out, where, set())
        from torchdoctor._virtual.loaded import record

        record(out, map_location, space)  # what stays on the cpu keeps this line as its maker, not torch.empty
        return out

    load.__name__ = load.__qualname__ = "load"
    load.__doc__ = original.__doc__
    return load


DESERIALIZE = "Attempting to deserialize object on"  # torch's refusal of a storage for a device the machine lacks


def _position(f: Any) -> int | None:
    """Where a seekable file object stands (a path: None)."""
    try:
        return int(f.tell()) if hasattr(f, "seek") and hasattr(f, "tell") else None
    except (OSError, ValueError):
        return None


def _mapped(original: Any, f: Any, start: int | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bool, str]:
    """(proven, what was tried) of the fix ``map_location="cpu"`` at a load that refused: the same file loaded
    again so, only under the weights-only unpickler (a full unpickling may run the file's code, so twice is not
    free of effects); a file object is read from where the load started and left where the refusal left it."""
    weights = kwargs.get("weights_only")
    if weights is False or args or (weights is None and tuple(int(x) for x in torch.__version__.split(".")[:2] if
                                                              x.isdigit()) < (2, 6)):
        return False, "not re-run: the file is loaded without weights_only=True, whose unpickling may run its code"
    if not isinstance(f, (str, os.PathLike)) and start is None:
        return False, "not re-run: the file object cannot be read again from where the load started"
    after = _position(f)
    try:
        if start is not None:
            f.seek(start)
        got = original(f, "cpu", **kwargs)
    except Exception as exc:  # the re-load's own failure is the answer
        return False, f"the same file loaded with map_location=\"cpu\" raised {type(exc).__name__}: " \
            f"{(str(exc).strip().splitlines() or [''])[0]}"[:300]
    finally:
        if after is not None:
            f.seek(after)
    from torchdoctor._virtual.loaded import tensors_of

    tensors = tensors_of(got)
    where = sorted({str(getattr(t, "_td_device", t.device)) for t in tensors})
    if where and where != ["cpu"]:
        return False, f"the same file loaded with map_location=\"cpu\" put tensors on {', '.join(where)}"
    return True, f"the same file loaded with map_location=\"cpu\": {len(tensors)} tensor(s), on the cpu"


def mapped_note(exc: BaseException) -> str:
    """How the fix ``map_location="cpu"`` of a refused load was judged, as the fix's note says it: ``(proven: ...)``
    or ``(unproven: ...)``."""
    tried = getattr(exc, "td_mapped", None)
    if not isinstance(tried, tuple):
        return "(unproven: the patched load was not re-run)"
    return f"({'proven' if tried[0] else 'unproven'}: {tried[1]})"


def _exists(dev: torch.device) -> None:
    """A storage bound for a device index the machine lacks: torch's own refusal, as a one-GPU machine raises it at
    ``torch.load`` (a checkpoint saved on ``cuda:3``, read without ``map_location``); the run explains it."""
    module = getattr(torch, dev.type, None)
    count, available = getattr(module, "device_count", None), getattr(module, "is_available", None)
    if dev.type == "mps" or not callable(count):
        return  # torch puts every mps storage on the one mps device
    if callable(available) and not available():  # a cuda checkpoint in an xpu run
        raise RuntimeError(f"Attempting to deserialize object on a {dev.type.upper()} device but torch.{dev.type}."
                           "is_available() is False. If you are running on a CPU-only machine, please use torch.load "
                           "with map_location=torch.device('cpu') to map your storages to the CPU.")
    n = count()
    if (dev.index or 0) >= n:
        raise RuntimeError(f"Attempting to deserialize object on {dev.type.upper()} device {dev.index or 0} but "
                           f"torch.{dev.type}.device_count() is {n}. Please use torch.load with map_location to map "
                           "your storages to an existing device.")


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
