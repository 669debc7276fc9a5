"""Facts about this machine and its Python environment, collected without ever raising, for the rules to judge.

Facts are a JSON-ready dict (``schema`` ``torchdoctor/facts/1``). Collecting them imports torch (a failing import is
a fact) but initialises no device: availability is *inferred* from the build and the drivers and devices found
through NVML / ``nvidia-smi`` / ``/proc`` / sysfs, unless ``probe=True`` asks torch's device APIs. Keys:

- ``torch``: installed, importable, error, version, build (``cpu``/``cuda``/``rocm``/``xpu``/``mps``), cuda, hip, xpu,
  mps_built, accelerator, path, import_seconds.
- ``cuda_available``, ``xpu_available``, ``mps_available``, ``cuda_device_count``, ``xpu_device_count``,
  ``availability_source`` (``inferred`` or ``probe``); ``probed``: what the device APIs said under probe.
- ``devices``: ``[{vendor, index, name, memory_mib, capability, source}]``; ``drivers`` (nvidia / intel / amdgpu /
  rocm: a version or module name, else None); ``tools``: vendor tools on PATH.
- ``packages``: every installed distribution, name normalised as PEP 503 says (``intel-extension-for-pytorch``), to
  its version; ``duplicates`` (installed twice); ``requires``: pins on torch/triton/IPEX (torchvision, xformers...).
- ``env``: device and rank variables when set (``RANK``, ``NCCL_*``...); ``distributed``: ``available``, ``backends``;
  ``host`` (RAM, OS, the build torchvision/torchaudio files show: ``_env/host.py``); ``platform``, ``python``, ``errors``.

>>> facts = collect_facts()
>>> facts["schema"], facts["torch"]["importable"]
('torchdoctor/facts/1', True)
"""

from __future__ import annotations

import functools
import glob
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from typing import Any

from torchdoctor._env.host import dist_version, host_facts
from torchdoctor._env.launch import LAUNCH_VARS, distributed_facts, env_facts
from torchdoctor._env.versions import normalize_name, oneapi_hides_gpus, visible_count

FACTS_SCHEMA = "torchdoctor/facts/1"
ENV_VARS = (
    "TORCHDOCTOR_DEVICE", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_LAUNCH_BLOCKING", "CUDA_HOME",
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NVML_BASED_CUDA_CHECK", "NVIDIA_VISIBLE_DEVICES", "BNB_CUDA_VERSION",
    "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "HSA_OVERRIDE_GFX_VERSION",
    "PYTORCH_HIP_ALLOC_CONF", "ZE_AFFINITY_MASK", "ZE_FLAT_DEVICE_HIERARCHY", "ONEAPI_DEVICE_SELECTOR",
    "SYCL_DEVICE_FILTER", "TORCH_DEVICE_BACKEND_AUTOLOAD", "PYTORCH_ENABLE_MPS_FALLBACK",
    "PYTORCH_MPS_HIGH_WATERMARK_RATIO", "ACCELERATE_USE_CPU", "ACCELERATE_USE_XPU", "ACCELERATE_MIXED_PRECISION", *LAUNCH_VARS,
)
# Packages whose Requires-Dist on these targets decide whether they fit the installed torch.
_PINNERS = ("torch", "torchvision", "torchaudio", "xformers", "ipex-llm", "intel-extension-for-pytorch", "torchao")
_PIN_TARGETS = ("torch", "triton", "pytorch-triton-rocm", "pytorch-triton-xpu", "intel-extension-for-pytorch")
_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "avx_vnni", "bf16", "sve", "i8mm")
_MIB = 1024 * 1024


def blank_facts() -> dict[str, Any]:
    """Every key of the facts with its nothing-found value; a new dict each call."""
    return {
        "schema": FACTS_SCHEMA, "probe": False, "seconds": None,
        "python": {"version": None, "executable": None},
        "platform": {"system": None, "machine": None, "release": None, "mac_ver": None, "rosetta": False,
                     "cpu": None, "cpu_flags": []},
        "torch": {"installed": True, "importable": True, "error": None, "version": None, "build": None, "cuda": None,
                  "hip": None, "xpu": None, "mps_built": False, "accelerator": None, "path": None, "import_seconds": None},
        "cuda_available": False, "xpu_available": False, "mps_available": False, "cuda_device_count": 0,
        "xpu_device_count": 0, "availability_source": "inferred", "probed": {},
        "host": {"memory_mib": None, "os": None, "wheels": {}},
        "devices": [], "drivers": {"nvidia": None, "intel": None, "amdgpu": None, "rocm": None}, "tools": {},
        "packages": {}, "duplicates": {}, "requires": {}, "env": {}, "errors": [], "distributed": {"available": None, "backends": []},
    }


def _run(cmd: list[str], errors: list[str], timeout: float = 3.0) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except Exception as exc:  # a hung or broken vendor tool is a fact, not a crash
        errors.append(f"{cmd[0]}: {type(exc).__name__}: {exc}")
        return None
    if done.returncode != 0:
        errors.append(f"{cmd[0]}: exit {done.returncode}: {(done.stderr or done.stdout).strip()[:200]}")
        return None
    return done.stdout


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(65536)
    except OSError:
        return None


@functools.lru_cache(maxsize=4)
def cpu_info(root: str = "/") -> tuple[str | None, tuple[str, ...]]:
    """The CPU model and the flags that matter for dtype choice (``avx512_bf16``, ``amx_bf16``, ARM ``bf16``)."""
    if platform.system() == "Darwin" and root == "/":
        errors: list[str] = []
        brand = (_run(["sysctl", "-n", "machdep.cpu.brand_string"], errors, 2.0) or "").strip() or None
        bf16 = (_run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], errors, 2.0) or "").strip() == "1"
        return brand, ("bf16",) if bf16 else ()
    model, flags = None, set()
    text = _read(os.path.join(root, "proc/cpuinfo")) or ""
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor block says it all
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "features"):
            flags.update(value.split())
    return model, tuple(f for f in _CPU_FLAGS if f in flags)


def _platform(errors: list[str]) -> dict[str, Any]:
    system, machine = platform.system(), platform.machine()
    rosetta = False
    if system == "Darwin" and machine == "x86_64":
        rosetta = (_run(["sysctl", "-n", "sysctl.proc_translated"], errors, 2.0) or "").strip() == "1"
    model, flags = cpu_info()
    return {"system": system, "machine": machine, "release": platform.release(),
            "mac_ver": platform.mac_ver()[0] if system == "Darwin" else None, "rosetta": rosetta,
            "cpu": model, "cpu_flags": list(flags)}


def _headers(dist: importlib.metadata.Distribution) -> tuple[str | None, str | None, list[str]]:
    """Name, Version and Requires-Dist read straight from the metadata header (the email parser costs 10x more)."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    head = text.split("\n\n", 1)[0]
    name = re.search(r"^Name:[ \t]*(\S+)", head, re.M)
    version = re.search(r"^Version:[ \t]*(\S+)", head, re.M)
    requires = [r.strip() for r in re.findall(r"^Requires-Dist:(.*)$", head, re.M)]
    if name and version:
        return name.group(1), version.group(1), requires
    md = dist.metadata  # unusual layout: let importlib parse it
    return md["Name"], md["Version"], list(dist.requires or [])


def _packages() -> tuple[dict[str, str], dict[str, list[str]], dict[str, list[str]]]:
    packages: dict[str, str] = {}
    duplicates: dict[str, list[str]] = {}
    requires: dict[str, list[str]] = {}
    for dist in importlib.metadata.distributions():  # one pass over sys.path
        try:
            name, version, reqs = _headers(dist)
        except Exception:
            continue
        if not name or not version:
            continue
        key = normalize_name(name)
        if key in packages:  # the first on sys.path is the one imported; an egg-link twin of the same version is noise
            if version != packages[key] and version not in duplicates.get(key, []):
                duplicates.setdefault(key, [packages[key]]).append(version)
            continue
        packages[key] = version
        if key in _PINNERS:
            lines = [r for r in reqs if normalize_name(re.split(r"[\s\[<>=!~;(]", r, maxsplit=1)[0]) in _PIN_TARGETS]
            if lines:
                requires[key] = lines
    return dict(sorted(packages.items())), duplicates, requires


def _torch(packages: dict[str, str]) -> dict[str, Any]:
    t = blank_facts()["torch"]
    t.update(installed="torch" in packages, version=packages.get("torch"))
    started, already = time.perf_counter(), "torch" in sys.modules
    try:
        import torch
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a broken torch (missing .so, ABI clash, SystemExit in an init hook) is the fact
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        tag = (t["version"] or "").partition("+")[2]
        guess = "cuda" if re.match(r"cu\d", tag) else "rocm" if tag.startswith("rocm") else tag if tag in ("cpu", "xpu") else None
        t.update(importable=False, error=f"{type(exc).__name__}: {first}"[:500], build=guess)
        return t
    t["import_seconds"] = 0.0 if already else round(time.perf_counter() - started, 3)
    version = getattr(torch, "version", None)
    cuda, hip, xpu = (getattr(version, k, None) for k in ("cuda", "hip", "xpu"))
    has_xpu = bool(getattr(torch._C, "_has_xpu", False))
    try:
        mps_built = bool(torch.backends.mps.is_built())
    except Exception:
        mps_built = False
    accelerator = None
    try:
        if hasattr(torch, "accelerator"):  # compile-time answer only: check_available=False initialises nothing
            acc = torch.accelerator.current_accelerator(check_available=False)
            accelerator = acc.type if acc is not None else None
    except Exception:
        pass
    build = "rocm" if hip else "cuda" if cuda else "xpu" if (xpu or has_xpu) else "mps" if mps_built else "cpu"
    t.update(version=str(torch.__version__), build=build, cuda=cuda, hip=hip, xpu=str(xpu) if xpu else None,
             mps_built=mps_built, accelerator=accelerator, path=os.path.dirname(getattr(torch, "__file__", "") or ""))
    return t


def _nvidia(root: str, tools: dict[str, str], errors: list[str]) -> tuple[list[dict[str, Any]], str | None]:
    devices: list[dict[str, Any]] = []
    driver = None
    if "nvidia-smi" in tools:
        fields = "name,memory.total,compute_cap,driver_version"
        out = _run([tools["nvidia-smi"], f"--query-gpu={fields}", "--format=csv,noheader,nounits"], errors)
        if out is None:  # drivers before 510 have no compute_cap field
            fallback = "--query-gpu=name,memory.total,driver_version"
            out = _run([tools["nvidia-smi"], fallback, "--format=csv,noheader,nounits"], errors)
            fields = "name,memory.total,driver_version"
        for i, line in enumerate(l for l in (out or "").splitlines() if l.strip()):
            row = dict(zip(fields.split(","), (c.strip() for c in line.split(","))))
            mem = row.get("memory.total", "")
            devices.append({"vendor": "nvidia", "index": i, "name": row.get("name"),
                            "memory_mib": int(float(mem)) if re.fullmatch(r"[\d.]+", mem) else None,
                            "capability": row.get("compute_cap") or None, "source": "nvidia-smi"})
            driver = row.get("driver_version") or driver
    text = _read(os.path.join(root, "proc/driver/nvidia/version"))
    m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+(?:\.\d+)+)", text or "")
    driver = driver or (m.group(1) if m else ("present" if text else None))
    if not devices:
        for i, info in enumerate(sorted(glob.glob(os.path.join(root, "proc/driver/nvidia/gpus/*/information")))):
            model = re.search(r"Model:\s*(.+)", _read(info) or "")
            devices.append({"vendor": "nvidia", "index": i, "name": model.group(1).strip() if model else None,
                            "memory_mib": None, "capability": None, "source": "/proc/driver/nvidia"})
    return devices, driver


_PCI_VENDORS = {"0x10de": "nvidia", "0x8086": "intel", "0x1002": "amd"}
_VENDOR_NAMES = {"intel": "Intel", "amd": "AMD"}


def _inventory(root: str, errors: list[str], apple: bool) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, str]]:
    tools = {t: p for t in ("nvidia-smi", "rocm-smi", "amd-smi", "xpu-smi", "sycl-ls") if (p := shutil.which(t))}
    devices, nv_driver = _nvidia(root, tools, errors)

    def mod(name: str) -> bool:
        return os.path.isdir(os.path.join(root, "sys/module", name))

    drivers: dict[str, Any] = {"nvidia": nv_driver or ("present" if mod("nvidia") else None),
                               "intel": "xe" if mod("xe") else "i915" if mod("i915") else None,
                               "amdgpu": "amdgpu" if mod("amdgpu") else None, "rocm": None}
    if os.path.exists(os.path.join(root, "dev/kfd")):
        drivers["rocm"] = (_read(os.path.join(root, "opt/rocm/.info/version")) or "").strip() or "kfd"
    counts = {"intel": 0, "amd": 0}
    for card in sorted(glob.glob(os.path.join(root, "sys/class/drm/card[0-9]*"))):
        if not re.fullmatch(r"card\d+", os.path.basename(card)):
            continue  # connectors such as card0-DP-1
        vendor = _PCI_VENDORS.get((_read(os.path.join(card, "device/vendor")) or "").strip().lower())
        if vendor in counts:
            pci = (_read(os.path.join(card, "device/device")) or "").strip()
            product = (_read(os.path.join(card, "device/product_name")) or "").strip()
            name = product or f"{_VENDOR_NAMES[vendor]} GPU {pci}".strip()
            devices.append({"vendor": vendor, "index": counts[vendor], "name": name, "memory_mib": None,
                            "capability": None, "source": "sysfs"})
            counts[vendor] += 1
    if apple:
        mem = (_run(["sysctl", "-n", "hw.memsize"], errors, 2.0) or "").strip()
        devices.append({"vendor": "apple", "index": 0, "name": cpu_info()[0] or "Apple silicon",
                        "memory_mib": int(mem) // _MIB if mem.isdigit() else None, "capability": None, "source": "sysctl"})
    return devices, drivers, tools


def _infer_availability(f: dict[str, Any]) -> None:
    t, env, drv = f["torch"], f["env"], f["drivers"]
    n = {v: sum(1 for d in f["devices"] if d["vendor"] == v) for v in ("nvidia", "amd", "intel")}
    cuda = xpu = 0
    if t["importable"] and t["build"] == "cuda" and drv["nvidia"]:
        cuda = visible_count(env.get("CUDA_VISIBLE_DEVICES"), n["nvidia"])
    elif t["importable"] and t["build"] == "rocm" and drv["rocm"]:
        cuda = n["amd"]
        for var in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
            cuda = visible_count(env.get(var), cuda)
    ipex_xpu = "+xpu" in (f["packages"].get("intel-extension-for-pytorch") or "")
    if t["importable"] and (t["build"] == "xpu" or ipex_xpu) and drv["intel"]:
        xpu = 0 if oneapi_hides_gpus(env.get("ONEAPI_DEVICE_SELECTOR")) else n["intel"]
    p = f["platform"]
    mac = tuple(int(x) for x in re.findall(r"\d+", p["mac_ver"] or "")[:2])
    f.update(cuda_available=cuda > 0, cuda_device_count=cuda, xpu_available=xpu > 0, xpu_device_count=xpu,
             mps_available=bool(t["importable"] and t["mps_built"] and p["system"] == "Darwin" and p["machine"] == "arm64"
                                and not p["rosetta"] and (not mac or mac >= (12, 3))),
             availability_source="inferred")


def _probe(f: dict[str, Any], errors: list[str]) -> None:
    """Ask torch's device APIs (may initialise CUDA/XPU): only under ``probe=True``."""
    import torch

    probed: dict[str, Any] = {}
    for kind, module in (("cuda", getattr(torch, "cuda", None)), ("xpu", getattr(torch, "xpu", None))):
        compiled = hasattr(torch._C, "_cuda_getDeviceCount") if kind == "cuda" else getattr(torch._C, "_has_xpu", False)
        if module is None or not compiled:
            continue
        entry: dict[str, Any] = {"available": False, "count": 0, "devices": [], "error": None}
        try:
            entry["available"] = bool(module.is_available())
            if not entry["available"]:
                module.init()  # raises with torch's own reason (driver too old, no device, ...)
            entry["count"] = int(module.device_count())
            for i in range(entry["count"]):
                props = module.get_device_properties(i)
                cap = f"{props.major}.{props.minor}" if hasattr(props, "major") and kind == "cuda" else None
                free, total = module.mem_get_info(i) if hasattr(module, "mem_get_info") else (None, props.total_memory)
                entry["devices"].append({"index": i, "name": props.name, "capability": cap, "memory_mib": int(total) // _MIB,
                                         "free_mib": None if free is None else int(free) // _MIB})
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]
        probed[kind] = entry
    if hasattr(torch, "accelerator"):
        try:
            acc = torch.accelerator.current_accelerator(check_available=True)
            count = int(torch.accelerator.device_count())
            probed["accelerator"] = {"type": acc.type if acc is not None else None, "count": count}
        except Exception as exc:
            errors.append(f"torch.accelerator: {type(exc).__name__}: {exc}"[:300])
    if f["torch"]["mps_built"]:
        try:
            probed["mps"] = {"available": bool(torch.backends.mps.is_available()), "count": 1, "devices": [], "error": None}
        except Exception as exc:
            probed["mps"] = {"available": False, "count": 0, "devices": [], "error": f"{type(exc).__name__}: {exc}"[:300]}
    f["probed"] = probed
    cuda, xpu = probed.get("cuda", {}), probed.get("xpu", {})
    f.update(cuda_available=bool(cuda.get("available")), cuda_device_count=cuda.get("count", 0) if cuda.get("available") else 0,
             xpu_available=bool(xpu.get("available")), xpu_device_count=xpu.get("count", 0) if xpu.get("available") else 0,
             mps_available=bool(probed.get("mps", {}).get("available")), availability_source="probe")
    vendor = "amd" if f["torch"]["build"] == "rocm" else "nvidia"
    if cuda.get("devices") and not any(d["vendor"] == vendor for d in f["devices"]):
        f["devices"] += [{"vendor": vendor, "index": d["index"], "name": d["name"], "memory_mib": d["memory_mib"],
                          "capability": d["capability"], "source": "torch"} for d in cuda["devices"]]


def collect_facts(*, probe: bool = False, _root: str = "/") -> dict[str, Any]:
    """Facts about this machine and Python environment, as a JSON-ready dict. Never raises.

    Without ``probe`` no torch device API is called (no CUDA/XPU initialisation); availability is inferred from the
    torch build plus the drivers and devices found. ``probe=True`` asks ``torch.cuda`` / ``torch.xpu`` / ``torch.backends.mps``.
    """
    started = time.perf_counter()
    errors: list[str] = []
    f = blank_facts()
    f.update(probe=bool(probe), python={"version": platform.python_version(), "executable": sys.executable},
             env=env_facts(ENV_VARS))
    steps = (
        ("platform", lambda: f.update(platform=_platform(errors))),
        ("packages", lambda: f.update(zip(("packages", "duplicates", "requires"), _packages()))),
        ("torch", lambda: f.update(torch=_torch(f["packages"]))),
        ("distributed", lambda: f.update(distributed=distributed_facts()) if f["torch"]["importable"] else None),
        ("host", lambda: f.update(host=host_facts(f["packages"], f["torch"]["build"], root=_root))),
        ("inventory", lambda: f.update(zip(("devices", "drivers", "tools"), _inventory(_root, errors, _apple(f))))),
        ("availability", lambda: _infer_availability(f)),
        ("probe", lambda: _probe(f, errors) if probe and f["torch"]["importable"] else None),
    )
    for name, step in steps:
        try:
            step()
        except Exception as exc:  # one broken source must not hide the others
            errors.append(f"{name}: {type(exc).__name__}: {exc}"[:300])
    f["errors"] = errors
    f["seconds"] = round(time.perf_counter() - started - (f["torch"]["import_seconds"] or 0.0), 4)
    return f


def _apple(f: dict[str, Any]) -> bool:
    return f["platform"]["system"] == "Darwin" and (f["platform"]["machine"] == "arm64" or bool(f["platform"]["rosetta"]))

def device_facts() -> dict[str, Any]:
    """The cheap subset ``pick_device()`` needs, with availability from torch's own checks.

    ``torch.cuda.is_available()`` / ``torch.xpu.is_available()`` count devices without creating a context (they never
    call ``_lazy_init``); they are asked only for backends compiled into this torch, so a CPU build asks nothing.
    """
    errors: list[str] = []
    f = blank_facts()
    f["env"] = env_facts(ENV_VARS)
    try:
        f["platform"] = _platform(errors)
        version = dist_version("torch")
        f["torch"] = _torch({"torch": version} if version else {})
        if f["torch"]["importable"]:
            _availability_from_torch(f)
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}"[:300])
    f["errors"] = errors
    return f


def _availability_from_torch(f: dict[str, Any]) -> None:
    import torch

    if hasattr(torch._C, "_cuda_getDeviceCount") and torch.cuda.is_available():
        f.update(cuda_available=True, cuda_device_count=int(torch.cuda.device_count()))
    if getattr(torch._C, "_has_xpu", False) and torch.xpu.is_available():
        f.update(xpu_available=True, xpu_device_count=int(torch.xpu.device_count()))
    if f["torch"]["mps_built"]:
        f["mps_available"] = bool(torch.backends.mps.is_available())
    f["availability_source"] = "torch"

