"""Facts about the host and the wheels beside torch, read from files only (nothing imported, no device touched).

- ``memory_mib``: installed RAM (``/proc/meminfo``; ``sysctl hw.memsize`` on macOS is read by the inventory);
- ``os``: the distribution's name (``PRETTY_NAME`` of ``/etc/os-release``), else ``platform.platform()``;
- ``wheels``: for torchvision / torchaudio, the build their files show (``cuda``, ``rocm`` or ``cpu``) and the
  evidence. PyPI forbids local version tags, so the CUDA torchvision pip pulls from PyPI is ``0.28.0`` with no
  ``+cu130``: its compiled extension still links ``libtorch_cuda.so`` / ``libcudart``, which a CPU torch does not
  have (``import torchvision`` then fails with "operator torchvision::nms does not exist"). The extension's
  dynamic-library names are read from its bytes; the wheel's RECORD shows bundled CUDA libraries.

>>> host_facts({}, "cpu", root="/nonexistent")["wheels"]
{}
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
from typing import Any

COMPANIONS = ("torchvision", "torchaudio")
# names a CUDA / ROCm build of an extension links or bundles (none of them is in a CPU build)
_CUDA_MARKS = (b"libtorch_cuda", b"libc10_cuda", b"libcudart", b"libnvjpeg")
_ROCM_MARKS = (b"libtorch_hip", b"libc10_hip", b"libamdhip64")
_READ_MAX = 256 << 20  # an extension bigger than this is not read


def dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except Exception:  # not installed, or broken metadata
        return None


def _meminfo(root: str) -> int | None:
    try:
        with open(os.path.join(root, "proc/meminfo"), encoding="ascii", errors="replace") as fh:
            m = re.search(r"^MemTotal:\s+(\d+)\s*kB", fh.read(), re.M)
    except OSError:
        return None
    return int(m.group(1)) // 1024 if m else None


def _os_name(root: str) -> str:
    try:
        with open(os.path.join(root, "etc/os-release"), encoding="utf-8", errors="replace") as fh:
            m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', fh.read(), re.M)
        if m and m.group(1).strip():
            return m.group(1).strip()
    except OSError:
        pass
    return platform.platform(terse=True)


def extension_build(files: list[tuple[str, str]]) -> tuple[str | None, str]:
    """(``cuda`` / ``rocm`` / ``cpu`` / None, the evidence) from a distribution's files: (path in RECORD, real
    path). Bundled CUDA libraries in RECORD decide first; then the library names inside its ``_C`` extension."""
    for rel, _ in files:
        base = os.path.basename(rel).lower()
        if base.startswith(("libcudart", "libnvjpeg", "libnvrtc", "libcublas")):
            return "cuda", f"its wheel bundles {os.path.basename(rel)}"
    for rel, real in files:
        base = os.path.basename(rel)
        if not (base.startswith("_C.") and base.endswith((".so", ".pyd"))) or not os.path.isfile(real):
            continue
        try:
            if os.path.getsize(real) > _READ_MAX:
                continue
            with open(real, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        for marks, build in ((_CUDA_MARKS, "cuda"), (_ROCM_MARKS, "rocm")):
            hit = next((m for m in marks if m in data), None)
            if hit is not None:
                return build, f"{rel} links {hit.decode()}"
        return "cpu", f"{rel} links no CUDA or ROCm library"
    return None, "no compiled extension found"


def _wheels(packages: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in COMPANIONS:
        if name not in packages:
            continue
        try:
            dist = importlib.metadata.distribution(name)
            files = [(str(p), str(dist.locate_file(p))) for p in (dist.files or [])]
        except Exception:
            continue
        build, evidence = extension_build(files)
        out[name] = {"build": build, "evidence": evidence}
    return out


def host_facts(packages: dict[str, str], torch_build: str | None, *, root: str = "/") -> dict[str, Any]:
    """``{"memory_mib", "os", "wheels"}``; wheels are read only beside a torch without CUDA (a CUDA torch runs
    any CUDA torchvision of its version; the version rules judge that)."""
    wheels = _wheels(packages) if torch_build != "cuda" else {}
    return {"memory_mib": _meminfo(root), "os": _os_name(root), "wheels": wheels}
