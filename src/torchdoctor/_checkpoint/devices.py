"""How many devices of a type ``torch.load`` would find on this machine, asked without importing torch.

A checkpoint saved on ``cuda:1`` loads only where torch sees two CUDA devices. When torch is already imported
(the Python API) it is asked, without initialising a device (``device_count`` reads NVML first). Otherwise (the
command line, which never imports torch) the answer comes from the installed torch's build (``torch/version.py``
read as text: a CPU build has no CUDA whatever the machine holds) and the devices the operating system lists:
NVIDIA's ``/proc/driver/nvidia/gpus``, AMD's KFD topology for ROCm builds, Apple silicon for MPS, honouring
``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES`` as torch does.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import sys

__all__ = ["device_count"]


@functools.lru_cache(maxsize=1)
def _build() -> dict[str, str | None]:
    """``cuda`` / ``hip`` / ``xpu`` versions of the installed torch build, read from its version.py."""
    try:
        spec = importlib.util.find_spec("torch")  # locates the package, imports nothing
        folder = list(spec.submodule_search_locations or [])[0] if spec else None
        with open(os.path.join(folder, "version.py"), encoding="utf-8") as f:  # type: ignore[arg-type]
            text = f.read()
    except (OSError, IndexError, TypeError, ValueError, ImportError):
        return {}
    out: dict[str, str | None] = {}
    for key in ("cuda", "hip", "xpu"):
        m = re.search(rf"^{key}\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
        out[key] = m.group(1) if m else None
    return out


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _visible(count: int, *names: str) -> int:
    for name in names:
        value = os.environ.get(name)
        if value is not None:
            return min(count, len([v for v in value.split(",") if v.strip()]))
    return count


def _amd_gpus() -> int:
    root = "/sys/class/kfd/kfd/topology/nodes"
    n = 0
    for node in _listdir(root):
        try:
            with open(os.path.join(root, node, "properties"), encoding="ascii") as f:
                n += bool(re.search(r"^simd_count\s+[1-9]", f.read(), re.M))
        except OSError:
            continue
    return n


def _without_torch(kind: str) -> int:
    build = _build()
    if kind == "cuda":
        if build.get("cuda"):
            return _visible(len(_listdir("/proc/driver/nvidia/gpus")), "CUDA_VISIBLE_DEVICES")
        if build.get("hip"):
            return _visible(_amd_gpus(), "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
        return 0
    if kind == "mps":
        import platform

        return int(sys.platform == "darwin" and platform.machine() == "arm64")
    if kind == "xpu" and build.get("xpu"):
        return len([c for c in _listdir("/sys/class/drm") if re.fullmatch(r"renderD\d+", c)])
    return 0


def device_count(kind: str) -> int:
    """Devices of type ``kind`` here (``cpu`` and ``meta``: 1); a broken driver counts as none."""
    if kind in ("cpu", "meta"):
        return 1
    torch = sys.modules.get("torch")
    if torch is None:
        return _without_torch(kind)
    try:
        if kind == "mps":
            return int(torch.backends.mps.is_available())
        module = getattr(torch, kind, None)
        return int(module.device_count()) if module is not None and hasattr(module, "device_count") else 0
    except Exception:  # a broken driver means "not here", never a crash
        return 0
