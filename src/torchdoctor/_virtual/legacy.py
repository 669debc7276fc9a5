"""Legacy type strings on a virtual device: ``t.type()`` answers ``'torch.cuda.FloatTensor'`` and
``t.type('torch.cuda.HalfTensor')`` / ``t.type(torch.cuda.HalfTensor)`` / ``t.type(torch.float16)`` move and cast
as on the device (a handler of the runtime's function mode); ``torch.cuda.FloatTensor`` and its kind as classes a
run installs (made once per process)."""

from __future__ import annotations

from typing import Any

import torch

from torchdoctor._placement import tensor_device
from torchdoctor._virtual import host as H, tensor as V
from torchdoctor._virtual.tensor import Space, VirtualTensor, is_virtual

_CPU = torch.device("cpu")
_TYPES: dict[tuple[str, int], tuple[Any, type]] = {}  # (kind.name, id(original)) -> (original, class), for the process


_LEGACY = {"Float": torch.float32, "Double": torch.float64, "Half": torch.float16, "BFloat16": torch.bfloat16,
           "Long": torch.int64, "Int": torch.int32, "Short": torch.int16, "Char": torch.int8, "Byte": torch.uint8,
           "Bool": torch.bool}


class _LegacyMeta(type):
    """``torch.cuda.FloatTensor``: called in a simulating thread it builds a virtual tensor, else the real type."""

    _td_original: Any
    _td_kind: str
    dtype: torch.dtype

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        space = V.current_space()
        if space is None or space.vtype != cls._td_kind:
            return cls._td_original(*args, **kwargs)
        with torch._C.DisableTorchFunction():
            cpu = getattr(torch, cls.__name__)(*args, **kwargs)  # the CPU legacy constructor: same arguments
        return H.MOVE(space, cpu, space.norm(cls._td_kind), None)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, torch.Tensor) and obj.type() == f"torch.{cls._td_kind}.{cls.__name__}"


def legacy_types(kind: str, module: Any) -> dict[str, Any]:
    """The legacy tensor types of ``torch.<kind>`` that exist here, as virtual-aware classes."""
    out: dict[str, Any] = {}
    for short, dtype in _LEGACY.items():
        name = f"{short}Tensor"
        original = module.__dict__.get(name)
        if original is not None:
            key = (f"{kind}.{name}", id(original))
            hit = _TYPES.get(key)
            if hit is None or hit[0] is not original:
                hit = _TYPES[key] = (original, _LegacyMeta(name, (), {
                    "_td_original": original, "_td_kind": kind, "dtype": dtype, "is_cuda": kind == "cuda",
                    "is_sparse": False, "__module__": f"torch.{kind}"}))
            out[name] = hit[1]
    return out


class _HostMeta(type):
    """``torch.LongTensor`` in a run: the CPU tensor it makes (``torch.LongTensor([0]).repeat(n)``, decoder start
    ids) is named by its maker and line when it meets the virtual tensors, as ``torch.zeros`` is; a legacy
    constructor takes no device, so its tensor is on the CPU whatever the run's device."""

    _td_original: Any

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        out = cls._td_original(*args, **kwargs)
        if V.current_space() is None:
            return out
        return _host_made(f"torch.{cls.__name__}", out)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._td_original)

    def __subclasscheck__(cls, sub: Any) -> bool:
        return issubclass(sub, cls._td_original)


def _host_made(op: str, out: Any) -> Any:
    """``out``, a real CPU tensor a legacy constructor made at the program's line in a run: kept with its maker, so
    what it meets names that line (``makers`` keeps ``torch.from_numpy``'s so)."""
    from torchdoctor._virtual import hostmade
    from torchdoctor._virtual.origin import Made

    space = V.current_space()
    if space is None or not isinstance(out, torch.Tensor) or isinstance(out, VirtualTensor) or \
            space.real_record(out) is not None:
        return out
    space.keep_real(out, None, made := Made(op, space.hooks.running()))
    hostmade.remember(out, made)
    return out


def host_original(t: Any) -> Any:
    """torch's own class for a run's stand-in (``torch.LongTensor`` given, or named ``'torch.LongTensor'``): what
    torch's C code takes (``set_default_tensor_type``, ``t.type(...)``); anything else as it is."""
    if isinstance(t, str) and t.startswith("torch.") and t.count(".") == 1:
        t = torch.__dict__.get(t[6:], t)
    return t._td_original if isinstance(t, _HostMeta) else t


def default_type_setter(original: Any) -> Any:
    """``torch.set_default_tensor_type`` taking the run's stand-in classes as torch's own."""
    def set_default_tensor_type(t: Any) -> Any:
        return original(host_original(t))

    return set_default_tensor_type


def host_types() -> dict[str, Any]:
    """torch's CPU legacy constructors (``torch.FloatTensor``, ``torch.LongTensor`` ...) as classes that name what
    they make in a run (made once per process)."""
    out: dict[str, Any] = {}
    for short, dtype in _LEGACY.items():
        name = f"{short}Tensor"
        original = torch.__dict__.get(name)
        if original is None or isinstance(original, _HostMeta):
            continue
        key = (f"cpu.{name}", id(original))
        hit = _TYPES.get(key)
        if hit is None or hit[0] is not original:
            hit = _TYPES[key] = (original, _HostMeta(name, (), {
                "_td_original": original, "dtype": dtype, "is_cuda": False, "is_sparse": False,
                "__module__": "torch"}))
        out[name] = hit[1]
    return out


def legacy_name(dtype: torch.dtype) -> str | None:
    """``torch.float32`` -> ``FloatTensor`` (None for dtypes without a legacy type)."""
    try:
        return torch.empty(0, dtype=dtype, device="meta").type().rpartition(".")[2]
    except Exception:  # quantized dtypes cannot be allocated this way
        return None


def parse_legacy(name: str) -> tuple[str | None, torch.dtype] | None:
    """``'torch.cuda.HalfTensor'`` -> ``('cuda', torch.float16)``; ``'torch.FloatTensor'`` -> ``(None, float32)``."""
    parts = name.split(".")
    if len(parts) not in (2, 3) or parts[0] != "torch" or not parts[-1].endswith("Tensor"):
        return None
    short = parts[-1][: -len("Tensor")]
    dtype = _LEGACY.get(short)
    if dtype is None:
        cpu = getattr(torch, parts[-1], None)
        dtype = getattr(cpu, "dtype", None)
    if not isinstance(dtype, torch.dtype):
        return None
    return (parts[1] if len(parts) == 3 else None), dtype


def legacy_type(space: Space, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``t.type()`` -> ``'torch.cuda.FloatTensor'``; ``t.type('torch.cuda.HalfTensor')`` / ``t.type(torch.cuda.
    HalfTensor)`` / ``t.type(torch.float16)`` move and cast as on the device."""
    self, want = args[0], args[1] if len(args) > 1 else kwargs.get("dtype")
    if want is None:
        if not isinstance(self, VirtualTensor):
            return func(*args, **kwargs)
        name = legacy_name(self.dtype) or self._td_elem.type().rpartition(".")[2]
        here = self._td_device.type
        return f"torch.{name}" if here == "cpu" else f"torch.{here}.{name}"
    if isinstance(want, torch.dtype):
        return H.MOVE(space, self, None, want) if isinstance(self, VirtualTensor) else func(*args, **kwargs)
    parsed = parse_legacy(want if isinstance(want, str) else
                              f"{getattr(want, '__module__', 'torch')}.{getattr(want, '__name__', '')}")
    if parsed is None:
        return func(*args, **kwargs)
    kind, dtype = parsed
    src = tensor_device(self)
    # a type of the device type the tensor is on keeps its index, as on the device
    target = _CPU if kind is None else src if src.type == kind else space.norm(kind)
    if not isinstance(self, VirtualTensor) and not is_virtual(target):
        if isinstance(want, _HostMeta):  # the run's stand-in for torch.LongTensor: torch's C code takes its own
            args, kwargs = (self, want._td_original, *args[2:]) if len(args) > 1 else args, \
                dict(kwargs, dtype=want._td_original) if len(args) < 2 else kwargs
        return func(*args, **kwargs)
    return H.MOVE(space, self, target, dtype)

