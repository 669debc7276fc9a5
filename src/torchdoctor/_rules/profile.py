"""What a target device can do: the profile the strict rules and the simulator consult.

A profile is data. ``DeviceProfile.for_device("cuda:1")`` gives sensible defaults (an 80 GB capability-9.0
GPU, enough devices for the index asked); pass your own to ask "would this run on a T4 (7.5)?".
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from torchdoctor._placement import parse_device
from torchdoctor._report.records import FrozenRecord
from torchdoctor._report.text import public_types

_GIB = 1024**3

# Dtypes a device type cannot compute in, whatever its capability (MPS has no float64 kernels, and holds no float8:
# moving one there raises "Trying to convert Float8_e4m3fn to the MPS backend but it does not have support for that
# dtype").
_NEVER = {
    "mps": frozenset({"float64", "complex128", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                      "float8_e8m0fnu"}),
}


# a frozen record written once, not compiled per class by the decorator: a virtual run imports this module before
# the program's first line (issue 43 point 4)
@dataclass(init=False, repr=False, eq=False)
class DeviceProfile(FrozenRecord):
    """A virtual device type: how many, which capability, how much memory, which dtypes it cannot run.

    >>> DeviceProfile.for_device("cuda:1").count
    2
    >>> DeviceProfile(type="cuda", capability=(7, 5)).supports("bfloat16", "conv")
    False
    """

    type: str = "cuda"
    count: int = 1
    capability: tuple[int, int] = (9, 0)
    memory: int = 80 * _GIB
    name: str = ""
    unsupported_dtypes: frozenset[str] = field(default_factory=frozenset)
    _fields = ("type", "count", "capability", "memory", "name", "unsupported_dtypes")

    def __init__(self, type: str = "cuda", count: int = 1, capability: tuple[int, int] = (9, 0),  # noqa: A002
                 memory: int = 80 * _GIB, name: str = "", unsupported_dtypes: frozenset[str] | None = None) -> None:
        if count < 1:
            raise ValueError(f"DeviceProfile.count must be >= 1, got {count}")
        if type not in ("cuda", "xpu", "mps", "cpu", "meta", "hpu", "npu"):
            raise ValueError(f"DeviceProfile.type {type!r} is not a device type (cuda, xpu, mps, cpu)")
        self.__dict__.update(type=type, count=count, capability=capability, memory=memory, name=name,
                             unsupported_dtypes=frozenset() if unsupported_dtypes is None else unsupported_dtypes)

    @classmethod
    def for_device(cls, device: str | torch.device, **overrides: object) -> DeviceProfile:
        d = parse_device(device)
        defaults: dict[str, object] = {"type": d.type, "count": (d.index or 0) + 1}
        if d.type == "mps":
            defaults.update(capability=(0, 0), memory=32 * _GIB, name="Apple M-series (virtual)")
        elif d.type == "xpu":
            defaults.update(capability=(0, 0), memory=48 * _GIB, name="Intel Data Center GPU (virtual)")
        elif d.type == "cuda":
            defaults.update(name="NVIDIA H100 (virtual)")
        defaults.update(overrides)
        return cls(**defaults)  # type: ignore[arg-type]

    def with_count(self, count: int) -> DeviceProfile:
        return replace(self, count=max(count, self.count))

    def runs(self, dtype: torch.dtype | str, family: str = "compute") -> bool:
        """``supports``, and a ``PlacementWarning`` when it runs only by emulation, slowly (``emulated``)."""
        ok = self.supports(dtype, family)
        note = emulated(self, dtype, family) if ok else None
        if note is not None:  # a speed note, never a problem
            import warnings

            from torchdoctor._report.model import PlacementWarning

            warnings.warn(PlacementWarning(note), stacklevel=3)
        return ok

    def supports(self, dtype: torch.dtype | str, family: str = "compute") -> bool:
        """Can this device run ``family`` (matmul, conv, norm, sdpa, scaled_mm, storage, compute) in ``dtype``?"""
        name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
        if name in self.unsupported_dtypes or name in _NEVER.get(self.type, frozenset()):
            return family == "storage" and self.type != "mps"
        if name.startswith("float8") and family in ("matmul", "conv", "norm", "sdpa", "compute") and self.type != "cpu":
            return False  # GPUs compute float8 only through _scaled_mm ("mul_cuda" not implemented for 'Float8_e4m3fn')
        if self.type == "cuda":
            major_minor = self.capability
            if name == "bfloat16" and family == "conv" and major_minor < (8, 0):
                return False  # (matmuls, attention and elementwise kernels run: ``emulated``)
            if name.startswith("float8") and family in ("matmul", "scaled_mm", "compute") and major_minor < (8, 9):
                return False
        if self.type == "mps" and name.startswith("float8") and family != "storage":
            return False
        return True


def emulated(profile: DeviceProfile, dtype: torch.dtype | str, family: str) -> str | None:
    """Why ``family`` in ``dtype`` runs on ``profile``'s device but slowly, or None. A CUDA card below capability 8.0
    (T4, V100) has no bfloat16 tensor cores: torch runs bfloat16 matmuls there by emulation (cuBLAS computes them
    in float32), several times slower than float16, and ``torch.cuda.is_bf16_supported()`` says True."""
    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    if profile.type == "cuda" and name == "bfloat16" and family in ("matmul", "sdpa") and profile.capability < (8, 0):
        cap = f"{profile.capability[0]}.{profile.capability[1]}"
        return (f"{profile.name or 'this GPU'} (capability {cap}) has no bfloat16 tensor cores: bfloat16 {family} runs "
                "by emulation, several times slower than float16; float16 (with a GradScaler to train) is the fast "
                "dtype there")
    return None


def refusal(device_type: str, dtype: torch.dtype) -> str:
    """What moving a tensor of ``dtype`` to a device that cannot hold it does, in torch's words, and the cast to make
    before the move (to a dtype the device holds: float8 storage to float16 there, float64 to float32)."""
    name = str(dtype).removeprefix("torch.")
    if device_type == "mps" and name.startswith("float8"):
        torch_name = {"float8_e4m3fn": "Float8_e4m3fn", "float8_e5m2": "Float8_e5m2"}.get(name, name)
        said = (f'TypeError: Trying to convert {torch_name} to the MPS backend but it does not have support for '
                'that dtype')
        return (f"{device_type} cannot hold {name} tensors, so this raises ({said}); cast it to a dtype {device_type} "
                "holds (float16, bfloat16 or float32) before the move")
    return f"{device_type} cannot hold {name} tensors, so this raises; cast it to float32 before the move"


public_types(DeviceProfile)


_FILLING = frozenset({"arange", "range", "linspace", "logspace", "ones", "zeros", "full", "eye", "rand", "randn",
                      "randint", "normal", "ones_like", "zeros_like", "full_like", "rand_like", "randn_like",
                      "new_ones", "new_zeros", "new_full"})  # factories that run a kernel of their dtype to fill


def factory_refusal(profile: DeviceProfile, name: str, dtype: Any, device: torch.device) -> str | None:
    """Why ``torch.<name>(dtype=dtype, device=device)`` raises on ``profile``'s device, or None: the device cannot
    hold the dtype (MPS's float64), or it has no kernels of it (Arc's float64: a filling factory such as ``arange``
    or ``ones`` raises, holding data does not)."""
    if not isinstance(dtype, torch.dtype) or device.type != profile.type:
        return None
    dname = str(dtype).removeprefix("torch.")
    if not profile.supports(dtype, "storage"):
        return f"{profile.type} cannot hold {dname} tensors, so the factory raises; make it float32"
    if dname in profile.unsupported_dtypes and name.removeprefix("torch.") in _FILLING:
        said = ' ("Required aspect fp64 is not supported on the device")' if profile.type == "xpu" and dname in (
            "float64", "complex128") else ""
        return f"{profile.name or profile.type} has no {dname} kernels, so the factory raises{said}; make it float32"
    return None
