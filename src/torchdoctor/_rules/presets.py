"""Named device profiles: ``torchdoctor simulate --profile t4`` and ``DeviceProfile`` values for the API.

Capabilities and memory are the public specifications of each part; what a capability implies (bf16 matmuls
emulated and no bf16 convolution below 8.0, no float8 below 8.9) is decided by ``DeviceProfile.supports``, not here. Intel Arc (Alchemist)
has no float64 hardware: IPEX refuses double kernels there ("Required aspect fp64 is not supported").

>>> preset("T4").capability, preset("t4").supports("bfloat16", "matmul"), preset("t4").supports("bfloat16", "conv")
((7, 5), True, False)
>>> preset("m2").type, preset("m2").supports("float64", "compute")
('mps', False)
"""

from __future__ import annotations

from torchdoctor._rules.profile import DeviceProfile

_GIB = 1024**3


def _cuda(name: str, capability: tuple[int, int], gib: int) -> DeviceProfile:
    return DeviceProfile(type="cuda", capability=capability, memory=gib * _GIB, name=name)


PRESETS: dict[str, DeviceProfile] = {
    "p100": _cuda("NVIDIA Tesla P100 16GB", (6, 0), 16),
    "v100": _cuda("NVIDIA V100 32GB", (7, 0), 32),
    "t4": _cuda("NVIDIA T4 16GB", (7, 5), 16),
    "rtx2080ti": _cuda("NVIDIA GeForce RTX 2080 Ti", (7, 5), 11),
    "a10g": _cuda("NVIDIA A10G 24GB", (8, 6), 24),
    "a100": _cuda("NVIDIA A100 80GB", (8, 0), 80),
    "a100-40gb": _cuda("NVIDIA A100 40GB", (8, 0), 40),
    "rtx3090": _cuda("NVIDIA GeForce RTX 3090", (8, 6), 24),
    "rtx4090": _cuda("NVIDIA GeForce RTX 4090", (8, 9), 24),
    "l4": _cuda("NVIDIA L4 24GB", (8, 9), 24),
    "l40s": _cuda("NVIDIA L40S 48GB", (8, 9), 48),
    "h100": _cuda("NVIDIA H100 80GB", (9, 0), 80),
    "h200": _cuda("NVIDIA H200 141GB", (9, 0), 141),
    "b200": _cuda("NVIDIA B200 180GB", (10, 0), 180),
    "m1": DeviceProfile(type="mps", capability=(0, 0), memory=16 * _GIB, name="Apple M1 (16 GB unified)"),
    "m2": DeviceProfile(type="mps", capability=(0, 0), memory=24 * _GIB, name="Apple M2 (24 GB unified)"),
    "m3": DeviceProfile(type="mps", capability=(0, 0), memory=36 * _GIB, name="Apple M3 Pro (36 GB unified)"),
    "m4": DeviceProfile(type="mps", capability=(0, 0), memory=48 * _GIB, name="Apple M4 Pro (48 GB unified)"),
    "arc": DeviceProfile(type="xpu", capability=(0, 0), memory=16 * _GIB, name="Intel Arc A770 16GB",
                         unsupported_dtypes=frozenset({"float64", "complex128"})),
    "max1550": DeviceProfile(type="xpu", capability=(0, 0), memory=128 * _GIB, name="Intel Data Center GPU Max 1550"),
    "cpu": DeviceProfile(type="cpu", capability=(0, 0), memory=64 * _GIB, name="CPU"),
}


def preset(name: str) -> DeviceProfile:
    """The profile called ``name`` (case and ``-``/``_`` insensitive); ``ValueError`` lists the names."""
    key = name.strip().lower().replace("_", "-")
    found = PRESETS.get(key) or PRESETS.get(key.replace("-", ""))
    if found is None:
        raise ValueError(f"unknown device profile {name!r}; known profiles: {', '.join(PRESETS)}")
    return found


def as_profile(value: DeviceProfile | str | None) -> DeviceProfile | None:
    """A ``profile=`` argument: a ``DeviceProfile``, a preset name (``"t4"``, ``"a100"``, ``"m2"``) or None."""
    if value is None or isinstance(value, DeviceProfile):
        return value
    if isinstance(value, str):
        return preset(value)
    raise TypeError(f"profile must be a DeviceProfile or a preset name ({', '.join(PRESETS)}), "
                    f"not {type(value).__name__}")


def describe() -> list[str]:
    """One line per preset, for ``--profile help``."""
    out = []
    for key, p in PRESETS.items():
        cap = f"capability {p.capability[0]}.{p.capability[1]}, " if p.type == "cuda" else ""
        out.append(f"{key:<10} {p.type:<5} {cap}{p.memory // _GIB} GiB  {p.name}")
    return out
