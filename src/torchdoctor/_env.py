"""Environment doctor: collect facts about this machine (never raising), then judge them with pure rules.

Facts are a JSON-ready dict (``schema`` ``torchdoctor/facts/1``). Collecting them imports torch (a failing import is
a fact) but initialises no device: availability is *inferred* from the build and the drivers and devices found
through NVML / ``nvidia-smi`` / ``/proc`` / sysfs, unless ``probe=True`` asks torch's device APIs. Keys:

- ``torch``: installed, importable, error, version, build (``cpu``/``cuda``/``rocm``/``xpu``/``mps``), cuda, hip, xpu,
  mps_built, accelerator, path, import_seconds.
- ``cuda_available``, ``xpu_available``, ``mps_available``, ``cuda_device_count``, ``xpu_device_count`` and
  ``availability_source`` (``inferred`` or ``probe``); ``probed`` holds what the device APIs said under probe.
- ``devices``: ``[{vendor, index, name, memory_mib, capability, source}]``; ``drivers``: nvidia / intel / amdgpu / rocm
  (a version or module name when present, else None); ``tools``: vendor tools found on PATH.
- ``packages``: every installed distribution, name normalised as PEP 503 says (lower case, runs of ``-_.`` become
  ``-``: ``intel-extension-for-pytorch``), to its version; ``duplicates`` (installed twice); ``requires``: the
  ``Requires-Dist`` lines on torch/triton/IPEX of the packages that pin them (torchvision, xformers, ipex-llm, ...).
- ``env``: the variables that change device behaviour, when set; ``platform``, ``python``, ``errors``, ``seconds``.

>>> facts = collect_facts()
>>> facts["schema"], facts["torch"]["importable"]
('torchdoctor/facts/1', True)
"""

from __future__ import annotations

import copy
import functools
import glob
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from torchdoctor._devices import DeviceChoice
    from torchdoctor._env_rules import Finding

FACTS_SCHEMA = "torchdoctor/facts/1"
ENV_SCHEMA = "torchdoctor/env/1"

ENV_VARS = (
    "TORCHDOCTOR_DEVICE", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_LAUNCH_BLOCKING", "CUDA_HOME",
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NVML_BASED_CUDA_CHECK", "NVIDIA_VISIBLE_DEVICES", "BNB_CUDA_VERSION",
    "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "HSA_OVERRIDE_GFX_VERSION",
    "PYTORCH_HIP_ALLOC_CONF", "ZE_AFFINITY_MASK", "ZE_FLAT_DEVICE_HIERARCHY", "ONEAPI_DEVICE_SELECTOR",
    "SYCL_DEVICE_FILTER", "TORCH_DEVICE_BACKEND_AUTOLOAD", "PYTORCH_ENABLE_MPS_FALLBACK",
    "PYTORCH_MPS_HIGH_WATERMARK_RATIO", "ACCELERATE_USE_CPU", "ACCELERATE_USE_XPU", "ACCELERATE_MIXED_PRECISION",
)
# Packages whose Requires-Dist on these targets decide whether they fit the installed torch.
_PINNERS = ("torch", "torchvision", "torchaudio", "xformers", "ipex-llm", "intel-extension-for-pytorch", "torchao")
_PIN_TARGETS = ("torch", "triton", "pytorch-triton-rocm", "pytorch-triton-xpu", "intel-extension-for-pytorch")
SHOWN_PACKAGES = (
    "intel-extension-for-pytorch", "ipex-llm", "bitsandbytes", "xformers", "triton", "transformers", "diffusers", "peft",
    "accelerate", "torchvision", "torchaudio", "torchao", "optimum-quanto", "safetensors",
)
_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "avx_vnni", "bf16", "sve", "i8mm")
_MIB = 1024 * 1024


def normalize_name(name: str) -> str:
    """PEP 503: ``Intel_Extension_For.PyTorch`` -> ``intel-extension-for-pytorch``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def visible_count(value: str | None, found: int) -> int:
    """How many of ``found`` devices a ``CUDA_VISIBLE_DEVICES``-style value leaves (the list stops at a bad entry).

    >>> visible_count(None, 2), visible_count("", 2), visible_count("1,0", 2), visible_count("0,-1,1", 2), visible_count("5", 2)
    (2, 0, 2, 1, 0)
    """
    if value is None:
        return found
    count, seen = 0, set()
    for token in (t.strip() for t in value.split(",")):
        if token.isdigit() and int(token) < found and token not in seen:
            seen.add(token)
        elif not token.upper().startswith(("GPU-", "MIG-")):
            break
        count += 1
    return count


def oneapi_hides_gpus(value: str | None) -> bool:
    """Does ``ONEAPI_DEVICE_SELECTOR`` leave no Level Zero GPU (the only backend torch XPU uses)?"""
    if value is None:
        return False
    terms = [t.strip().lower() for t in value.split(";") if t.strip()]
    positive = [t for t in terms if not t.startswith("!")]
    banned = any(t in ("!level_zero:*", "!level_zero:gpu", "!*:gpu", "!*:*") for t in terms)
    keeps = any(t.split(":")[0] in ("level_zero", "*") and not t.endswith((":cpu", ":fpga")) for t in positive)
    return not keeps and (banned or bool(positive))


def _defaults() -> dict[str, Any]:
    return {
        "schema": FACTS_SCHEMA, "probe": False, "seconds": None,
        "python": {"version": None, "executable": None},
        "platform": {"system": None, "machine": None, "release": None, "mac_ver": None, "rosetta": False,
                     "cpu": None, "cpu_flags": []},
        "torch": {"installed": True, "importable": True, "error": None, "version": None, "build": None, "cuda": None,
                  "hip": None, "xpu": None, "mps_built": False, "accelerator": None, "path": None, "import_seconds": None},
        "cuda_available": False, "xpu_available": False, "mps_available": False,
        "cuda_device_count": 0, "xpu_device_count": 0, "availability_source": "inferred", "probed": {},
        "devices": [], "drivers": {"nvidia": None, "intel": None, "amdgpu": None, "rocm": None}, "tools": {},
        "packages": {}, "duplicates": {}, "requires": {}, "env": {}, "errors": [],
    }


def _merge(default: Any, given: Any) -> Any:
    if isinstance(default, dict):
        if not isinstance(given, dict):
            return copy.deepcopy(default)
        out = {k: _merge(v, given[k]) if k in given else copy.deepcopy(v) for k, v in default.items()}
        out.update({k: copy.deepcopy(v) for k, v in given.items() if k not in default})
        return out
    if isinstance(default, list) and not isinstance(given, list):
        return copy.deepcopy(default)
    return copy.deepcopy(given)


def complete_facts(facts: Any) -> dict[str, Any]:
    """A copy of (possibly partial) facts with every key present; package names normalised. Never mutates."""
    full: dict[str, Any] = _merge(_defaults(), facts if isinstance(facts, dict) else {})
    for key in ("packages", "requires", "duplicates"):
        full[key] = {normalize_name(str(k)): v for k, v in full[key].items()}
    full["env"] = {str(k): str(v) for k, v in full["env"].items() if v is not None}
    full["devices"] = [d for d in full["devices"] if isinstance(d, dict)]
    return full


# --- collection ------------------------------------------------------------------------------------------


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
    t = _defaults()["torch"]
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
    f = _defaults()
    f.update(probe=bool(probe), python={"version": platform.python_version(), "executable": sys.executable},
             env={k: os.environ[k] for k in ENV_VARS if k in os.environ})
    steps = (
        ("platform", lambda: f.update(platform=_platform(errors))),
        ("packages", lambda: f.update(zip(("packages", "duplicates", "requires"), _packages()))),
        ("torch", lambda: f.update(torch=_torch(f["packages"]))),
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
    p = f["platform"]
    return p["system"] == "Darwin" and (p["machine"] == "arm64" or bool(p["rosetta"]))


def device_facts() -> dict[str, Any]:
    """The cheap subset ``pick_device()`` needs, with availability from torch's own checks.

    ``torch.cuda.is_available()`` / ``torch.xpu.is_available()`` count devices without creating a context (they never
    call ``_lazy_init``); they are asked only for backends compiled into this torch, so a CPU build asks nothing.
    """
    errors: list[str] = []
    f = _defaults()
    f["env"] = {k: os.environ[k] for k in ENV_VARS if k in os.environ}
    try:
        f["platform"] = _platform(errors)
        version = _dist_version("torch")
        f["torch"] = _torch({"torch": version} if version else {})
        if f["torch"]["importable"]:
            _availability_from_torch(f)
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}"[:300])
    f["errors"] = errors
    return f


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except Exception:
        return None


def _availability_from_torch(f: dict[str, Any]) -> None:
    import torch

    if hasattr(torch._C, "_cuda_getDeviceCount") and torch.cuda.is_available():
        f.update(cuda_available=True, cuda_device_count=int(torch.cuda.device_count()))
    if getattr(torch._C, "_has_xpu", False) and torch.xpu.is_available():
        f.update(xpu_available=True, xpu_device_count=int(torch.xpu.device_count()))
    if f["torch"]["mps_built"]:
        f["mps_available"] = bool(torch.backends.mps.is_available())
    f["availability_source"] = "torch"


# --- the report ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnvReport:
    """What ``torchdoctor env`` says: ``.facts``, ``.findings``, ``.device`` (a ``DeviceChoice`` or None),
    ``.choice`` (the device decision as JSON), ``.capabilities``, ``.ok`` (no warning or error), ``.to_dict()``."""

    facts: dict[str, Any]
    findings: tuple[Finding, ...]
    device: DeviceChoice | None
    choice: dict[str, Any]
    capabilities: dict[str, Any]
    source: str = "this machine"

    @property
    def ok(self) -> bool:
        return not any(f.severity in ("warning", "error") for f in self.findings)

    def __bool__(self) -> bool:
        return self.ok

    def to_dict(self) -> dict[str, Any]:
        return {"schema": ENV_SCHEMA, "facts": self.facts, "findings": [f.to_dict() for f in self.findings],
                "device": self.choice, "capabilities": self.capabilities}

    def text(self) -> str:
        return render(self)

    def __str__(self) -> str:
        return self.text()


EnvReport.__module__ = "torchdoctor"


def env_report(facts: dict[str, Any] | None = None, *, probe: bool = False) -> EnvReport:
    """Diagnose this machine (``facts=None``) or saved facts: findings, device choice and dtype capabilities.

    ``facts`` may be the ``facts`` part of ``torchdoctor env --json`` or the whole document (its recorded
    capabilities are kept: they cannot be probed away from the machine).

    >>> report = env_report({"torch": {"version": "2.13.0+cpu", "build": "cpu"}})
    >>> report.ok, report.choice["device"], [f.code for f in report.findings]
    (True, 'cpu', ['cpu_only_build'])
    """
    from torchdoctor import _devices
    from torchdoctor._env_rules import run_rules

    recorded: dict[str, Any] | None = None
    if facts is None:
        full, source = complete_facts(collect_facts(probe=probe)), "this machine"
    else:
        if isinstance(facts, dict) and str(facts.get("schema", "")).startswith("torchdoctor/env/") and "facts" in facts:
            recorded = facts.get("capabilities") if isinstance(facts.get("capabilities"), dict) else None
            facts = facts["facts"]
        full, source = complete_facts(facts), "saved facts"
    findings = run_rules(full)
    choice = _devices.decide_safely(full)
    device: DeviceChoice | None = None
    if choice["device"] is not None and full["torch"]["importable"]:
        try:
            device = _devices.DeviceChoice.from_doc(choice)
        except Exception:  # torch unusable here although the facts say it works (saved facts)
            device = None
    if recorded is not None:
        caps = recorded
    elif choice["device"] is None:
        caps = {"device": None, "probed": False, "note": "no device chosen"}
    elif facts is not None:
        note = "facts from another run: capabilities are probed on the machine itself"
        caps = {"device": choice["device"], "probed": False, "note": note}
    elif choice["device"] == "cpu" or probe:
        try:
            caps = _devices.capabilities(choice["device"])
        except Exception as exc:
            caps = {"device": choice["device"], "probed": False, "note": f"probe failed: {type(exc).__name__}: {exc}"[:300]}
    else:
        caps = {"device": choice["device"], "probed": False,
                "note": f"not probed: `torchdoctor env --probe` runs small ops on {choice['device']}"}
    return EnvReport(full, findings, device, choice, caps, source)


def _yes(value: Any) -> str:
    return "yes" if value is True else "no" if value is False else "-"


def render(report: EnvReport) -> str:
    f, lines = report.facts, []
    t, p = f["torch"], f["platform"]
    lines.append(f"torchdoctor env ({report.source}; availability {f['availability_source']})")
    lines.append(f"  python        {f['python']['version']}  {f['python']['executable'] or ''}".rstrip())
    flags = f" ({', '.join(p['cpu_flags'])})" if p["cpu_flags"] else ""
    lines.append(f"  platform      {p['system']} {p['machine']}, {p['cpu'] or 'CPU'}{flags}")
    if t["importable"]:
        extra = ", ".join(f"{k} {t[k]}" for k in ("cuda", "hip", "xpu") if t[k]) + (", mps built" if t["mps_built"] else "")
        lines.append(f"  torch         {t['version']}  build: {t['build']}{' (' + extra + ')' if extra else ''}")
    else:
        lines.append(f"  torch         {t['version'] or 'not installed'}  does not import: {t['error']}")
    devs = [f"{d['vendor']} {d.get('name') or '?'}" + (f" ({d['memory_mib']} MiB)" if d.get("memory_mib") else "")
            + (f" capability {d['capability']}" if d.get("capability") else "") for d in f["devices"]]
    lines.append(f"  accelerators  {'; '.join(devs) if devs else 'none found'}")
    drivers = ", ".join(f"{k} {v}" for k, v in f["drivers"].items() if v)
    lines.append(f"  drivers       {drivers or 'none (NVIDIA, Intel, AMD)'}")
    avail = ", ".join(k for k in ("cuda", "xpu", "mps") if f[f"{k}_available"])
    lines.append(f"  available     {avail or 'no accelerator'}")
    c = report.choice
    lines.append(f"  device        {c['device'] or 'none'}: {c['reason']}")
    shown = [f"{n} {f['packages'][n]}" for n in SHOWN_PACKAGES if n in f["packages"]]
    lines.append(f"  packages      {', '.join(shown) if shown else 'none of the packages that matter'}")
    lines.append(f"  environment   {', '.join(f'{k}={v!r}' for k, v in f['env'].items()) or 'no device variable set'}")
    caps = report.capabilities
    if caps.get("probed"):
        fams = list(dict.fromkeys(k for row in caps["dtypes"].values() for k in row))
        origin = "small real ops run here" if report.source == "this machine" else "recorded with the saved facts"
        lines.append(f"capabilities of {caps['device']} ({origin}):")
        lines.append(("  " + "dtype".ljust(15) + "".join(fam.ljust(12) for fam in fams)).rstrip())
        for name, row in caps["dtypes"].items():
            lines.append(("  " + name.ljust(15) + "".join(_yes(row.get(fam)).ljust(12) for fam in fams)).rstrip())
        lines.append(f"  recommended dtype: {caps['recommended']} ({caps['recommended_reason']})")
    else:
        lines.append(f"capabilities: {caps.get('note', 'not probed')}")
    counts = {s: sum(1 for x in report.findings if x.severity == s) for s in ("error", "warning", "info")}
    lines.append(f"findings: {counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info")
    for x in report.findings:
        lines.append(f"  [{x.severity}] {x.code}: {x.message}")
        if x.fix:
            lines.append(f"      fix: {x.fix}")
    return "\n".join(lines)


def load_facts(path: str) -> dict[str, Any]:
    """Read ``torchdoctor env --json`` output (or its ``facts`` part); a ``UsageError`` with one line otherwise."""
    from torchdoctor._cli import UsageError

    try:
        if path == "-":
            doc = json.load(sys.stdin)
        else:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
    except OSError as exc:
        raise UsageError(f"cannot read facts file {path!r}: {exc.strerror or exc}") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"facts file {path!r} is not valid JSON: {exc}") from exc
    is_env = isinstance(doc, dict) and str(doc.get("schema", "")).startswith("torchdoctor/env/")
    is_env = is_env and isinstance(doc.get("facts"), dict)
    is_facts = isinstance(doc, dict) and (doc.get("schema") == FACTS_SCHEMA or isinstance(doc.get("torch"), dict))
    if not (is_env or is_facts):
        raise UsageError(
            f"{path!r} is not torchdoctor env JSON (expected the output of `torchdoctor env --json` or its \"facts\" part)")
    return doc


def cli(args: Any) -> int:
    from torchdoctor._cli import UsageError, print_json

    if args.facts and args.probe:
        raise UsageError("--probe asks this machine's devices; it cannot be combined with --facts")
    report = env_report(load_facts(args.facts) if args.facts else None, probe=bool(args.probe))
    if args.json:
        print_json(report.to_dict())
    else:
        print(report.text())
    return 0 if report.ok else 1
