"""Environment rules: pure functions of the facts dict (see ``torchdoctor._env``) that return findings.

Rules are data: ``@rule("code")`` registers a function in ``RULES`` and refuses a duplicate code. A rule reads
facts only (never the live machine), so a user's ``torchdoctor env --json`` can be diagnosed anywhere.
Package names in ``facts["packages"]`` are PEP 503-normalised (``intel-extension-for-pytorch``); ``pkg()``
normalises the name it is asked for, so rules may spell it either way.

>>> codes = [f.code for f in run_rules({"torch": {"version": "2.13.0+cpu", "build": "cpu"}})]
>>> codes
['cpu_only_build']
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torchdoctor._env import complete_facts, normalize_name, oneapi_hides_gpus, visible_count

INFO, WARNING, ERROR = "info", "warning", "error"
SEVERITIES = (ERROR, WARNING, INFO)

Facts = Mapping[str, Any]


@dataclass(frozen=True)
class Finding:
    """One thing the environment doctor found: a stable ``code``, a ``severity``, what is wrong, how to fix it."""

    code: str
    severity: str
    message: str
    fix: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "severity": self.severity, "message": self.message, "fix": self.fix}


Rule = Callable[[Facts], "list[Finding]"]
RULES: dict[str, Rule] = {}


def rule(code: str) -> Callable[[Rule], Rule]:
    """Register a rule under ``code``; a second rule with the same code is a programming error."""

    def register(fn: Rule) -> Rule:
        if code in RULES:
            raise ValueError(f"duplicate environment rule code {code!r}")
        RULES[code] = fn
        return fn

    return register


def run_rules(facts: Facts, rules: Mapping[str, Rule] | None = None) -> tuple[Finding, ...]:
    """All findings for ``facts`` (partial facts are completed with defaults), errors first.

    A rule that breaks on odd facts becomes an ``internal_rule_error`` info finding instead of an exception.
    """
    full = complete_facts(facts)
    out: list[Finding] = []
    for code, fn in (RULES if rules is None else rules).items():
        try:
            found = fn(full)
        except Exception as exc:  # a diagnostic must not break on a user's odd facts file (STYLE 6)
            found = [Finding("internal_rule_error", INFO, f"rule {code} failed: {type(exc).__name__}: {exc}")]
        out.extend(found)
    return tuple(sorted(out, key=lambda f: (SEVERITIES.index(f.severity), f.code)))


# --- versions, without a dependency on `packaging` -------------------------------------------------------


def release(version: str | None) -> tuple[int, ...]:
    """``'2.13.0+cpu'`` -> ``(2, 13, 0)``; ``'0.45.3.dev0'`` -> ``(0, 45, 3)``.

    >>> release("2.1.0a0+cxx11.abi"), release(None)
    ((2, 1, 0), ())
    """
    m = re.match(r"v?(\d+(?:\.\d+)*)", (version or "").strip())
    return tuple(int(p) for p in m.group(1).split(".")) if m else ()


def public(version: str | None) -> str:
    return (version or "").split("+", 1)[0].strip()


def local(version: str | None) -> str:
    return (version or "").split("+", 1)[1] if "+" in (version or "") else ""


def tag_family(tag: str) -> str | None:
    """Wheel local tag -> build family: ``cu130`` -> ``cuda``, ``rocm6.1`` -> ``rocm``, ``cpu``, ``xpu``."""
    tag = tag.lower()
    for prefix, family in (("cu", "cuda"), ("rocm", "rocm"), ("cpu", "cpu"), ("xpu", "xpu")):
        if tag.startswith(prefix) and (prefix != "cu" or tag[2:3].isdigit()):
            return family
    return None


def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (a > b) - (a < b)


def satisfies(version: str, spec: str) -> bool:
    """Does ``version`` meet a specifier set such as ``==2.13.0``, ``>=2.4,<3``, ``==2.1.*`` (release parts only)?

    >>> satisfies("2.13.0+cpu", "==2.13.0"), satisfies("2.5.1", ">=2.4,<3"), satisfies("2.3.0", "==2.1.*")
    (True, True, False)
    """
    v = release(version)
    for part in filter(None, (p.strip() for p in spec.strip("() ").split(","))):
        m = re.match(r"(===|==|!=|>=|<=|~=|>|<)\s*(\S+)", part)
        if not m:
            continue
        op, target = m.groups()
        if target.endswith(".*"):
            prefix = release(target[:-2])
            ok = v[: len(prefix)] == prefix
            if (op == "==" and not ok) or (op == "!=" and ok):
                return False
            continue
        if op in ("==", "===") and "+" in target:  # a local pin (`2.1.10+xpu`) means that exact wheel
            if version.strip() != target:
                return False
            continue
        c = _cmp(v, release(target))
        if op == "~=":
            t = release(target)
            if c < 0 or v[: max(len(t) - 1, 1)] != t[: max(len(t) - 1, 1)]:
                return False
        elif not {"==": c == 0, "===": c == 0, "!=": c != 0, ">=": c >= 0, "<=": c <= 0, ">": c > 0, "<": c < 0}[op]:
            return False
    return True


def requirement(line: str) -> tuple[str, str, str]:
    """``'torch==2.5.1; platform_system == "Linux"'`` -> ``('torch', '==2.5.1', 'platform_system == "Linux"')``."""
    req, _, marker = line.partition(";")
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*)", req)
    if not m:
        return "", "", marker.strip()
    return normalize_name(m.group(1)), m.group(2).strip().strip("()").strip(), marker.strip()


def pins(facts: Facts, dist: str, target: str, *, extras: bool = False) -> list[str]:
    """Specifiers that ``dist`` puts on ``target`` (from its ``Requires-Dist``); extra-only lines when asked."""
    out = []
    for line in facts["requires"].get(normalize_name(dist), []):
        name, spec, marker = requirement(line)
        if name == normalize_name(target) and spec and (extras or "extra" not in marker):
            out.append(spec)
    return out


# --- small views of the facts ----------------------------------------------------------------------------


def pkg(facts: Facts, name: str) -> str | None:
    return facts["packages"].get(normalize_name(name))


def torch_v(facts: Facts) -> str:
    return facts["torch"]["version"] or pkg(facts, "torch") or "?"


def gpus(facts: Facts, vendor: str) -> list[dict[str, Any]]:
    return [d for d in facts["devices"] if d.get("vendor") == vendor]


def has_nvidia(facts: Facts) -> bool:
    return bool(facts["drivers"].get("nvidia")) or bool(gpus(facts, "nvidia"))


def has_amd_compute(facts: Facts) -> bool:
    return bool(facts["drivers"].get("rocm")) and bool(gpus(facts, "amd") or facts["drivers"].get("amdgpu"))


def has_intel_gpu(facts: Facts) -> bool:
    return bool(gpus(facts, "intel")) and bool(facts["drivers"].get("intel"))


def apple_silicon(facts: Facts) -> bool:
    p = facts["platform"]
    return p["system"] == "Darwin" and (p["machine"] == "arm64" or bool(p["rosetta"]))


def xpu_capable(facts: Facts) -> bool:
    """XPU comes from torch itself (2.4+) or from an IPEX ``+xpu`` wheel beside an older torch."""
    return facts["torch"]["build"] == "xpu" or tag_family(local(pkg(facts, "intel-extension-for-pytorch"))) == "xpu"


def wheel_index(facts: Facts) -> str:
    """The download.pytorch.org index matching this torch build: ``cpu``, ``cu128``, ``rocm6.1``, ``xpu``."""
    t = facts["torch"]
    tag = local(t["version"] or pkg(facts, "torch"))
    if tag_family(tag) in ("cuda", "rocm") and not (t["cuda"] or t["hip"]):
        return tag  # torch does not import, but its wheel tag says which index it came from
    if t["build"] == "cuda" and t["cuda"]:
        return "cu" + "".join(t["cuda"].split(".")[:2])
    if t["build"] == "rocm" and t["hip"]:
        return "rocm" + ".".join(t["hip"].split(".")[:2])
    return "xpu" if t["build"] == "xpu" else "cpu"


def cuda_index_for_driver(driver: str | None) -> str | None:
    """The newest CUDA wheel index an NVIDIA driver can run (Linux minimums of CUDA minor-version compatibility)."""
    d = release(driver)
    for minimum, index in (((580, 65), "cu130"), ((570, 26), "cu128"), ((525, 60), "cu126"), ((450, 80), "cu118")):
        if d and _cmp(d, minimum) >= 0:
            return index
    return None


def hit(code: str, severity: str, message: str, fix: str | None = None) -> list[Finding]:
    return [Finding(code, severity, message, fix)]


def _env(facts: Facts, name: str) -> str | None:
    value = facts["env"].get(name)
    return None if value is None else str(value)


# --- the rules -------------------------------------------------------------------------------------------


@rule("torch_import_failed")
def _torch_import(f: Facts) -> list[Finding]:
    t = f["torch"]
    if t["importable"]:
        return []
    if not t["installed"] and not t["version"]:
        return hit("torch_import_failed", ERROR, "torch is not installed in this Python environment.",
                   "pip install torch  # pick the wheel for your hardware: https://pytorch.org/get-started/locally/")
    pin = f"=={public(t['version'])}" if t["version"] else ""
    err = str(t["error"] or "unknown error").rstrip(". ")
    return hit("torch_import_failed", ERROR, f"`import torch` fails: {err}.",
               f"pip install --force-reinstall torch{pin} --index-url https://download.pytorch.org/whl/{wheel_index(f)}")


@rule("cpu_only_build")
def _cpu_only(f: Facts) -> list[Finding]:
    if f["torch"]["build"] != "cpu" or has_nvidia(f) or has_amd_compute(f) or has_intel_gpu(f) or apple_silicon(f):
        return []
    if xpu_capable(f) or f["cuda_available"] or f["xpu_available"] or f["mps_available"]:
        return []
    return hit("cpu_only_build", INFO,
               f"CPU-only build of torch {torch_v(f)} on a machine without an accelerator: everything runs on the CPU, "
               "as expected.")


@rule("cpu_torch_with_nvidia")
def _cpu_torch_nvidia(f: Facts) -> list[Finding]:
    if f["torch"]["build"] != "cpu" or not has_nvidia(f):
        return []
    names = ", ".join(sorted({d.get("name") or "?" for d in gpus(f, "nvidia")})) or "GPU list unknown"
    driver = f["drivers"].get("nvidia")
    index = cuda_index_for_driver(driver) or "cu126"
    return hit("cpu_torch_with_nvidia", WARNING,
               f"torch {torch_v(f)} is a CPU-only build, but this machine has an NVIDIA driver ({driver}; {names}): "
               "every model runs on the CPU and torch.cuda.is_available() is False.",
               f"pip install --force-reinstall torch=={public(torch_v(f))} --index-url https://download.pytorch.org/whl/{index}"
               "  # and torchvision/torchaudio from the same index")


@rule("cpu_torch_with_amd_or_intel_gpu")
def _cpu_torch_other_gpu(f: Facts) -> list[Finding]:
    if f["torch"]["build"] != "cpu" or xpu_capable(f) or has_nvidia(f):
        return []
    if has_amd_compute(f):
        return hit("cpu_torch_with_amd_or_intel_gpu", INFO,
                   f"torch {torch_v(f)} is a CPU-only build, but this machine has an AMD GPU with the ROCm driver (/dev/kfd).",
                   "pip install torch --index-url https://download.pytorch.org/whl/rocm6.4  # pick the ROCm version you have")
    if has_intel_gpu(f):
        return hit("cpu_torch_with_amd_or_intel_gpu", INFO,
                   f"torch {torch_v(f)} is a CPU-only build, but this machine has an Intel GPU ({f['drivers']['intel']} driver); "
                   "torch 2.4+ XPU wheels can use it.",
                   "pip install torch --index-url https://download.pytorch.org/whl/xpu")
    return []


@rule("build_without_device")
def _build_without_device(f: Facts) -> list[Finding]:
    build = f["torch"]["build"]
    present = {"cuda": has_nvidia(f) or has_amd_compute(f), "rocm": has_amd_compute(f) or has_nvidia(f), "xpu": has_intel_gpu(f)}
    if build not in present or present[build]:
        return []
    what = {"cuda": "NVIDIA driver or GPU", "rocm": "AMD GPU with the ROCm driver (/dev/kfd)", "xpu": "Intel GPU with its driver"}
    return hit("build_without_device", INFO,
               f"torch {torch_v(f)} is a {build.upper()} build, but no {what[build]} was found: it runs on the CPU "
               "(fine on a CPU-only CI; the GPU libraries are unused).",
               "pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cpu"
               "  # if this machine has no GPU")


@rule("cuda_torch_on_amd")
def _cuda_on_amd(f: Facts) -> list[Finding]:
    if f["torch"]["build"] != "cuda" or has_nvidia(f) or not has_amd_compute(f):
        return []
    return hit("cuda_torch_on_amd", WARNING,
               f"torch {torch_v(f)} is an NVIDIA CUDA build, but this machine's GPU is AMD (ROCm): torch.cuda finds no device.",
               "pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/rocm6.4"
               "  # ROCm builds answer to torch.cuda")


@rule("driver_without_cuda")
def _driver_without_cuda(f: Facts) -> list[Finding]:
    build = f["torch"]["build"]
    driver = f["drivers"].get("nvidia") if build == "cuda" else f["drivers"].get("rocm") if build == "rocm" else None
    if f["availability_source"] != "probe" or not driver or f["cuda_available"]:
        return []
    if build == "cuda" and visible_count(_env(f, "CUDA_VISIBLE_DEVICES"), len(gpus(f, "nvidia")) or 64) == 0:
        return []  # cuda_visible_devices_hides_all says why
    err = (f["probed"].get("cuda") or {}).get("error")
    return hit("driver_without_cuda", ERROR,
               f"{'An NVIDIA' if build == 'cuda' else 'A ROCm'} driver is present ({driver}) and torch {torch_v(f)} is a "
               f"{build.upper()} build, but torch.cuda.is_available() is False" + (f": {str(err).rstrip('. ')}." if err else "."),
               "nvidia-smi  # does the driver see the GPU? In a container: docker run --gpus all ...; "
               "a driver older than the torch CUDA version fails too (see nvidia_driver_too_old)")


_MIN_DRIVER = {"Linux": {11: (450, 80), 12: (525, 60), 13: (580, 65)}, "Windows": {11: (452, 39), 12: (527, 41), 13: (580, 0)}}


@rule("nvidia_driver_too_old")
def _driver_too_old(f: Facts) -> list[Finding]:
    cuda, driver = f["torch"]["cuda"], f["drivers"].get("nvidia")
    if f["torch"]["build"] != "cuda" or not cuda or not release(driver):
        return []
    minimum = _MIN_DRIVER.get(f["platform"]["system"], _MIN_DRIVER["Linux"]).get(release(cuda)[0])
    if minimum is None or _cmp(release(driver), minimum) >= 0:
        return []
    fit = cuda_index_for_driver(driver)
    return hit("nvidia_driver_too_old", ERROR,
               f"NVIDIA driver {driver} is older than CUDA {cuda} (torch {torch_v(f)}) needs "
               f"({'.'.join(map(str, minimum))} or newer): torch.cuda.is_available() is False.",
               "update the NVIDIA driver" + (f", or: pip install --force-reinstall torch --index-url "
                                             f"https://download.pytorch.org/whl/{fit}" if fit else ""))


@rule("cuda_visible_devices_hides_all")
def _cvd_hides(f: Facts) -> list[Finding]:
    value = _env(f, "CUDA_VISIBLE_DEVICES")
    found = len(gpus(f, "nvidia")) or len(gpus(f, "amd"))
    if value is None or not (has_nvidia(f) or (f["torch"]["build"] == "rocm" and has_amd_compute(f))):
        return []
    if visible_count(value, found or 64) > 0:
        return []
    return hit("cuda_visible_devices_hides_all", WARNING,
               f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU ({found or 'some'} found): torch.cuda.is_available() is False "
               "and everything runs on the CPU.",
               "unset CUDA_VISIBLE_DEVICES  # or: export CUDA_VISIBLE_DEVICES=0")


@rule("hip_visible_devices_hides_all")
def _hip_hides(f: Facts) -> list[Finding]:
    if not has_amd_compute(f):
        return []
    found = len(gpus(f, "amd")) or 64
    for var in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        value = _env(f, var)
        if value is not None and visible_count(value, found) == 0:
            return hit("hip_visible_devices_hides_all", WARNING,
                       f"{var}={value!r} hides every AMD GPU: torch.cuda.is_available() is False on ROCm.", f"unset {var}")
    return []


@rule("intel_selector_hides_gpus")
def _oneapi_hides(f: Facts) -> list[Finding]:
    value = _env(f, "ONEAPI_DEVICE_SELECTOR")
    if value is None or not (has_intel_gpu(f) or xpu_capable(f)):
        return []
    if not oneapi_hides_gpus(value):
        return []
    return hit("intel_selector_hides_gpus", WARNING,
               f"ONEAPI_DEVICE_SELECTOR={value!r} leaves no Level Zero GPU, the only backend torch XPU uses: "
               "torch.xpu.is_available() is False.",
               "unset ONEAPI_DEVICE_SELECTOR  # or: export ONEAPI_DEVICE_SELECTOR=level_zero:gpu")


@rule("cuda_and_xpu_visible")
def _cuda_and_xpu(f: Facts) -> list[Finding]:
    if not (f["cuda_available"] and f["xpu_available"]):
        return []
    return hit("cuda_and_xpu_visible", INFO,
               "CUDA and XPU are both available: the usual priority (CUDA > XPU > MPS > CPU, also torchdoctor.pick_device's) "
               "picks cuda:0; code that checks XPU first (IPEX paths) picks the Intel GPU.",
               "TORCHDOCTOR_DEVICE=xpu  # or in code: device = torchdoctor.pick_device('xpu')")


@rule("mps_fallback_enabled")
def _mps_fallback(f: Facts) -> list[Finding]:
    if _env(f, "PYTORCH_ENABLE_MPS_FALLBACK") != "1":
        return []
    if not (f["platform"]["system"] == "Darwin" or f["torch"]["mps_built"] or f["mps_available"]):
        return []
    return hit("mps_fallback_enabled", WARNING,
               "PYTORCH_ENABLE_MPS_FALLBACK=1: ops MPS lacks run silently on the CPU (a warning once, then slow copies); "
               "an error you would want to see (e.g. float64 on MPS) is hidden.",
               "unset PYTORCH_ENABLE_MPS_FALLBACK  # to see which op is missing; re-enable once you know")


@rule("cuda_launch_blocking")
def _launch_blocking(f: Facts) -> list[Finding]:
    if _env(f, "CUDA_LAUNCH_BLOCKING") not in ("1", "true", "True"):
        return []
    return hit("cuda_launch_blocking", INFO,
               "CUDA_LAUNCH_BLOCKING=1: every kernel launch waits for the GPU (exact error locations, much slower).",
               "unset CUDA_LAUNCH_BLOCKING  # when you are done debugging")


@rule("torchdoctor_device_unavailable")
def _td_device(f: Facts) -> list[Finding]:
    value = _env(f, "TORCHDOCTOR_DEVICE")
    if not value or value.strip().lower() == "auto" or not f["torch"]["importable"]:
        return []
    from torchdoctor._devices import unavailable_reason

    why = unavailable_reason(f, value)
    if why is None:
        return []
    return hit("torchdoctor_device_unavailable", ERROR,
               f"TORCHDOCTOR_DEVICE={value!r} cannot be used: {why}. torchdoctor.pick_device() raises.",
               "unset TORCHDOCTOR_DEVICE  # to use the best available device")


@rule("ipex_beside_ipex_llm")
def _ipex_llm(f: Facts) -> list[Finding]:
    ipex, llm = pkg(f, "intel-extension-for-pytorch"), pkg(f, "ipex-llm")
    if not ipex or not llm:
        return []
    wanted = pins(f, "ipex-llm", "intel-extension-for-pytorch", extras=True)
    if wanted and any(satisfies(ipex, w) for w in wanted):
        return []
    said = f"it pins IPEX {' or '.join(sorted(set(wanted)))}" if wanted else "it brings its own IPEX (none for ipex-llm[xpu_2.6])"
    return hit("ipex_beside_ipex_llm", ERROR if wanted or tag_family(local(ipex)) == "cpu" else WARNING,
               f"intel_extension_for_pytorch {ipex} is installed beside ipex-llm {llm}, but {said}: ipex-llm's XPU ops then "
               "dispatch through the wrong IPEX and can run on the CPU backend ('Could not run ... from the CPU backend').",
               "pip uninstall -y intel-extension-for-pytorch && pip install --force-reinstall --pre 'ipex-llm[xpu]' "
               "--extra-index-url https://pytorch-extension.intel.com/release-whl/stable/xpu/us/")


@rule("ipex_in_cuda_env")
def _ipex_cuda(f: Facts) -> list[Finding]:
    ipex = pkg(f, "intel-extension-for-pytorch")
    if not ipex or not (f["torch"]["build"] == "cuda" or has_nvidia(f)):
        return []
    return hit("ipex_in_cuda_env", WARNING,
               f"intel_extension_for_pytorch {ipex} is installed in an NVIDIA/CUDA environment: transformers, accelerate and "
               "diffusers see IPEX and may take XPU or IPEX-CPU code paths instead of CUDA.",
               "pip uninstall -y intel-extension-for-pytorch")


@rule("ipex_torch_mismatch")
def _ipex_torch(f: Facts) -> list[Finding]:
    ipex, tv = pkg(f, "intel-extension-for-pytorch"), torch_v(f)
    if not ipex or not release(tv) or release(ipex)[:2] == release(tv)[:2]:
        return []
    mm = ".".join(map(str, release(ipex)[:2]))
    return hit("ipex_torch_mismatch", ERROR,
               f"intel_extension_for_pytorch {ipex} needs torch {mm}.*, but torch {tv} is installed: importing IPEX fails or "
               "its kernels are not registered.",
               f"pip install 'torch=={mm}.*'  # or the IPEX release built for torch {'.'.join(map(str, release(tv)[:2]))}")


@rule("xformers_torch_mismatch")
def _xformers(f: Facts) -> list[Finding]:
    xf, tv = pkg(f, "xformers"), torch_v(f)
    bad = [p for p in pins(f, "xformers", "torch") if xf and release(tv) and not satisfies(tv, p)]
    if not bad:
        return []
    return hit("xformers_torch_mismatch", ERROR,
               f"xformers {xf} was built for torch{bad[0]}, but torch {tv} is installed: its C++/CUDA kernels do not load "
               "and memory-efficient attention falls back or fails ('xFormers can't load C++/CUDA extensions').",
               f"pip install --force-reinstall xformers --index-url https://download.pytorch.org/whl/{wheel_index(f)}"
               "  # the build that matches your torch")


_SYMPTOM = {"torchvision": "'operator torchvision::nms does not exist'", "torchaudio": "'libtorchaudio.so: undefined symbol'"}


def _companion(code: str, dist: str) -> None:
    """torchvision / torchaudio: their ``torch==`` pin and their wheel's build tag must match torch's."""

    @rule(code)
    def check(f: Facts) -> list[Finding]:
        dv, tv = pkg(f, dist), torch_v(f)
        if not dv or not release(tv):
            return []
        problems = [f"it requires torch{p}" for p in pins(f, dist, "torch") if p.startswith("==") and not satisfies(tv, p)]
        mine, theirs = tag_family(local(dv)), tag_family(local(tv)) or f["torch"]["build"]
        if mine and theirs and mine != theirs:
            problems.append(f"it is a {mine.upper()} wheel (+{local(dv)}) and torch is a {theirs.upper()} build")
        elif mine == "cuda" and f["torch"]["cuda"] and local(dv)[2:4] != "".join(f["torch"]["cuda"].split("."))[:2]:
            problems.append(f"it was built for another CUDA major version (+{local(dv)}, torch has CUDA {f['torch']['cuda']})")
        if not problems:
            return []
        r = release(tv) + (0,)
        match = f"0.{r[1] + 15}" if dist == "torchvision" else f"{r[0]}.{r[1]}"  # the release trains move together
        return hit(code, ERROR,
                   f"{dist} {dv} does not match torch {tv}: {'; '.join(problems)}. `import {dist}` fails ({_SYMPTOM[dist]}), "
                   "and so do transformers/peft imports that load it.",
                   f"pip install --force-reinstall torch=={public(tv)} '{dist}=={match}.*' "
                   f"--index-url https://download.pytorch.org/whl/{wheel_index(f)}  # or: pip uninstall -y {dist}")


_companion("torchvision_torch_mismatch", "torchvision")
_companion("torchaudio_torch_mismatch", "torchaudio")


@rule("triton_torch_mismatch")
def _triton(f: Facts) -> list[Finding]:
    for name in ("triton", "pytorch-triton-rocm", "pytorch-triton-xpu"):
        have = pkg(f, name)
        bad = [p for p in pins(f, "torch", name) if have and not satisfies(have, p)]
        if bad:
            return hit("triton_torch_mismatch", WARNING,
                       f"torch {torch_v(f)} requires {name}{bad[0]}, but {name} {have} is installed: torch.compile / inductor "
                       "kernels fail to build or import.",
                       f"pip install '{name}{bad[0]}'")
    return []


@rule("bnb_old_multi_gpu")
def _bnb_multi(f: Facts) -> list[Finding]:
    bnb = pkg(f, "bitsandbytes")
    count = f["cuda_device_count"]  # visible devices: inferred from the inventory and CUDA_VISIBLE_DEVICES, or probed
    if not bnb or not release(bnb) or _cmp(release(bnb), (0, 45, 3)) >= 0 or count < 2:
        return []
    return hit("bnb_old_multi_gpu", WARNING,
               f"bitsandbytes {bnb} with {count} GPUs: before 0.45.3, Params4bit.to() leaves quant_state.code on the first GPU, "
               "so a 4-bit layer moved to cuda:1 fails or computes with tensors on two devices.",
               "pip install -U 'bitsandbytes>=0.45.3'")


@rule("bnb_cuda_version_override")
def _bnb_cuda(f: Facts) -> list[Finding]:
    value, cuda = _env(f, "BNB_CUDA_VERSION"), f["torch"]["cuda"]
    if value is None or not pkg(f, "bitsandbytes") or not cuda or value == "".join(cuda.split(".")[:2]):
        return []
    return hit("bnb_cuda_version_override", WARNING,
               f"BNB_CUDA_VERSION={value} makes bitsandbytes load its CUDA {value} library while torch uses CUDA {cuda}.",
               "unset BNB_CUDA_VERSION")


def _capability(d: Mapping[str, Any]) -> tuple[int, ...]:
    return release(str(d.get("capability") or ""))


@rule("fp8_compute_unsupported")
def _fp8(f: Facts) -> list[Finding]:
    old = [d for d in gpus(f, "nvidia") if _capability(d) and _cmp(_capability(d), (8, 9)) < 0]
    if not old:
        return []
    d = old[0]
    return hit("fp8_compute_unsupported", INFO,
               f"{d.get('name') or 'The NVIDIA GPU'} (capability {d['capability']}) can store float8 weights but cannot compute "
               "in float8 (torch._scaled_mm needs 8.9+): FP8 checkpoints must be upcast to bfloat16/float16 to run.",
               "pipe.transformer.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)"
               "  # or model.to(torch.bfloat16)")


@rule("bf16_unsupported_gpu")
def _bf16(f: Facts) -> list[Finding]:
    old = [d for d in gpus(f, "nvidia") if _capability(d) and _cmp(_capability(d), (8, 0)) < 0]
    if not old:
        return []
    d = old[0]
    return hit("bf16_unsupported_gpu", INFO,
               f"{d.get('name') or 'The NVIDIA GPU'} (capability {d['capability']}) has no native bfloat16: bf16 matmuls are "
               "emulated (slow) or fail. Use float16 there.",
               "model.to(torch.float16)  # torchdoctor.recommend_dtype(device) says the same")


@rule("duplicate_distributions")
def _duplicates(f: Facts) -> list[Finding]:
    dup = {n: vs for n, vs in f["duplicates"].items() if len(set(vs)) > 1}
    if not dup:
        return []
    listed = "; ".join(f"{n} {' and '.join(vs)}" for n, vs in sorted(dup.items()))
    return hit("duplicate_distributions", WARNING,
               f"Installed twice in different site-packages (user site and venv?): {listed}. The first on sys.path is imported, "
               "tools may read the other's metadata.",
               f"python -m pip uninstall {' '.join(sorted(dup))}  # repeat until gone, then reinstall once")


@rule("rosetta_python")
def _rosetta(f: Facts) -> list[Finding]:
    if not f["platform"]["rosetta"]:
        return []
    return hit("rosetta_python", WARNING,
               "This Python runs under Rosetta (x86_64) on Apple silicon: MPS is unavailable and everything is emulated.",
               "install an arm64 Python (python.org universal installer, or Homebrew in /opt/homebrew) and recreate the venv")


@rule("mps_unavailable")
def _mps(f: Facts) -> list[Finding]:
    p = f["platform"]
    if p["system"] != "Darwin" or p["machine"] != "arm64" or p["rosetta"] or f["mps_available"]:
        return []
    mac = release(p.get("mac_ver"))
    if not f["torch"]["mps_built"]:
        why = f"torch {torch_v(f)} was built without MPS"
    elif mac and _cmp(mac, (12, 3)) < 0:
        why = f"macOS {p['mac_ver']} is older than 12.3"
    elif f["availability_source"] == "probe":
        why = "torch.backends.mps.is_available() is False"
    else:
        return []
    return hit("mps_unavailable", WARNING, f"Apple silicon, but MPS is unavailable: {why}.",
               "pip install --force-reinstall torch  # macOS arm64 wheels include MPS; macOS 12.3+ is needed")


@rule("nvidia_wheels_without_cuda_torch")
def _nvidia_wheels(f: Facts) -> list[Finding]:
    names = sorted(n for n in f["packages"] if n.startswith("nvidia-") and n not in ("nvidia-ml-py", "nvidia-ml-py3"))
    if not names or f["torch"]["build"] == "cuda" or not f["torch"]["build"]:
        return []
    return hit("nvidia_wheels_without_cuda_torch", INFO,
               f"{len(names)} NVIDIA CUDA wheels ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}) are installed but "
               f"torch {torch_v(f)} is a {f['torch']['build'].upper()} build: leftovers of a CUDA torch (gigabytes), "
               "or a package pulled them in.",
               f"pip uninstall -y {' '.join(names)}")
