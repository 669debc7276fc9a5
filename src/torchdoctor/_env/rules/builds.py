"""Environment rules about torch builds, drivers, devices and device variables (registered on import).

>>> from torchdoctor._env.rules.registry import run_rules
>>> [f.code for f in run_rules({"torch": {"version": "2.13.0+cpu", "build": "cpu"}})]
['cpu_only_build']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchdoctor._env.rules.registry import ERROR, Facts, EnvFinding, INFO, WARNING, apple_silicon, env_var, gpus, has_amd_compute, has_intel_gpu, has_nvidia, hit, rule, torch_v, wheel_index, xpu_capable
from torchdoctor._env.versions import compare, cuda_index_for_driver, oneapi_hides_gpus, public, release, visible_count


# --- the rules -------------------------------------------------------------------------------------------


@rule("torch_import_failed")
def _torch_import(f: Facts) -> list[EnvFinding]:
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
def _cpu_only(f: Facts) -> list[EnvFinding]:
    if f["torch"]["build"] != "cpu" or has_nvidia(f) or has_amd_compute(f) or has_intel_gpu(f) or apple_silicon(f):
        return []
    if xpu_capable(f) or f["cuda_available"] or f["xpu_available"] or f["mps_available"]:
        return []
    return hit("cpu_only_build", INFO,
               f"CPU-only build of torch {torch_v(f)} on a machine without an accelerator: everything runs on the CPU, "
               "as expected.")


@rule("cpu_torch_with_nvidia")
def _cpu_torch_nvidia(f: Facts) -> list[EnvFinding]:
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
def _cpu_torch_other_gpu(f: Facts) -> list[EnvFinding]:
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
def _build_without_device(f: Facts) -> list[EnvFinding]:
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
def _cuda_on_amd(f: Facts) -> list[EnvFinding]:
    if f["torch"]["build"] != "cuda" or has_nvidia(f) or not has_amd_compute(f):
        return []
    return hit("cuda_torch_on_amd", WARNING,
               f"torch {torch_v(f)} is an NVIDIA CUDA build, but this machine's GPU is AMD (ROCm): torch.cuda finds no device.",
               "pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/rocm6.4"
               "  # ROCm builds answer to torch.cuda")


@rule("driver_without_cuda")
def _driver_without_cuda(f: Facts) -> list[EnvFinding]:
    build = f["torch"]["build"]
    driver = f["drivers"].get("nvidia") if build == "cuda" else f["drivers"].get("rocm") if build == "rocm" else None
    if f["availability_source"] != "probe" or not driver or f["cuda_available"]:
        return []
    if build == "cuda" and visible_count(env_var(f, "CUDA_VISIBLE_DEVICES"), len(gpus(f, "nvidia")) or 64) == 0:
        return []  # cuda_visible_devices_hides_all says why
    err = (f["probed"].get("cuda") or {}).get("error")
    return hit("driver_without_cuda", ERROR,
               f"{'An NVIDIA' if build == 'cuda' else 'A ROCm'} driver is present ({driver}) and torch {torch_v(f)} is a "
               f"{build.upper()} build, but torch.cuda.is_available() is False" + (f": {str(err).rstrip('. ')}." if err else "."),
               "nvidia-smi  # does the driver see the GPU? In a container: docker run --gpus all ...; "
               "a driver older than the torch CUDA version fails too (see nvidia_driver_too_old)")


_MIN_DRIVER = {"Linux": {11: (450, 80), 12: (525, 60), 13: (580, 65)}, "Windows": {11: (452, 39), 12: (527, 41), 13: (580, 0)}}


@rule("nvidia_driver_too_old")
def _driver_too_old(f: Facts) -> list[EnvFinding]:
    cuda, driver = f["torch"]["cuda"], f["drivers"].get("nvidia")
    if f["torch"]["build"] != "cuda" or not cuda or not release(driver):
        return []
    minimum = _MIN_DRIVER.get(f["platform"]["system"], _MIN_DRIVER["Linux"]).get(release(cuda)[0])
    if minimum is None or compare(release(driver), minimum) >= 0:
        return []
    fit = cuda_index_for_driver(driver)
    return hit("nvidia_driver_too_old", ERROR,
               f"NVIDIA driver {driver} is older than CUDA {cuda} (torch {torch_v(f)}) needs "
               f"({'.'.join(map(str, minimum))} or newer): torch.cuda.is_available() is False.",
               "update the NVIDIA driver" + (f", or: pip install --force-reinstall torch --index-url "
                                             f"https://download.pytorch.org/whl/{fit}" if fit else ""))


@rule("cuda_visible_devices_hides_all")
def _cvd_hides(f: Facts) -> list[EnvFinding]:
    value = env_var(f, "CUDA_VISIBLE_DEVICES")
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
def _hip_hides(f: Facts) -> list[EnvFinding]:
    if not has_amd_compute(f):
        return []
    found = len(gpus(f, "amd")) or 64
    for var in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        value = env_var(f, var)
        if value is not None and visible_count(value, found) == 0:
            return hit("hip_visible_devices_hides_all", WARNING,
                       f"{var}={value!r} hides every AMD GPU: torch.cuda.is_available() is False on ROCm.", f"unset {var}")
    return []


@rule("intel_selector_hides_gpus")
def _oneapi_hides(f: Facts) -> list[EnvFinding]:
    value = env_var(f, "ONEAPI_DEVICE_SELECTOR")
    if value is None or not (has_intel_gpu(f) or xpu_capable(f)):
        return []
    if not oneapi_hides_gpus(value):
        return []
    return hit("intel_selector_hides_gpus", WARNING,
               f"ONEAPI_DEVICE_SELECTOR={value!r} leaves no Level Zero GPU, the only backend torch XPU uses: "
               "torch.xpu.is_available() is False.",
               "unset ONEAPI_DEVICE_SELECTOR  # or: export ONEAPI_DEVICE_SELECTOR=level_zero:gpu")


@rule("cuda_and_xpu_visible")
def _cuda_and_xpu(f: Facts) -> list[EnvFinding]:
    if not (f["cuda_available"] and f["xpu_available"]):
        return []
    return hit("cuda_and_xpu_visible", INFO,
               "CUDA and XPU are both available: the usual priority (CUDA > XPU > MPS > CPU, also torchdoctor.pick_device's) "
               "picks cuda:0; code that checks XPU first (IPEX paths) picks the Intel GPU.",
               "TORCHDOCTOR_DEVICE=xpu  # or in code: device = torchdoctor.pick_device('xpu')")


@rule("mps_fallback_enabled")
def _mps_fallback(f: Facts) -> list[EnvFinding]:
    if env_var(f, "PYTORCH_ENABLE_MPS_FALLBACK") != "1":
        return []
    if not (f["platform"]["system"] == "Darwin" or f["torch"]["mps_built"] or f["mps_available"]):
        return []
    return hit("mps_fallback_enabled", WARNING,
               "PYTORCH_ENABLE_MPS_FALLBACK=1: ops MPS lacks run silently on the CPU (a warning once, then slow copies); "
               "an error you would want to see (e.g. float64 on MPS) is hidden.",
               "unset PYTORCH_ENABLE_MPS_FALLBACK  # to see which op is missing; re-enable once you know")


@rule("cuda_launch_blocking")
def _launch_blocking(f: Facts) -> list[EnvFinding]:
    if env_var(f, "CUDA_LAUNCH_BLOCKING") not in ("1", "true", "True"):
        return []
    return hit("cuda_launch_blocking", INFO,
               "CUDA_LAUNCH_BLOCKING=1: every kernel launch waits for the GPU (exact error locations, much slower).",
               "unset CUDA_LAUNCH_BLOCKING  # when you are done debugging")


@rule("torchdoctor_device_unavailable")
def _td_device(f: Facts) -> list[EnvFinding]:
    value = env_var(f, "TORCHDOCTOR_DEVICE")
    if not value or value.strip().lower() == "auto" or not f["torch"]["importable"]:
        return []
    from torchdoctor._env.devices import unavailable_reason

    why = unavailable_reason(f, value)
    if why is None:
        return []
    return hit("torchdoctor_device_unavailable", ERROR,
               f"TORCHDOCTOR_DEVICE={value!r} cannot be used: {why}. torchdoctor.pick_device() raises.",
               "unset TORCHDOCTOR_DEVICE  # to use the best available device")


def _capability(d: Mapping[str, Any]) -> tuple[int, ...]:
    return release(str(d.get("capability") or ""))


@rule("fp8_compute_unsupported")
def _fp8(f: Facts) -> list[EnvFinding]:
    old = [d for d in gpus(f, "nvidia") if _capability(d) and compare(_capability(d), (8, 9)) < 0]
    if not old:
        return []
    d = old[0]
    return hit("fp8_compute_unsupported", INFO,
               f"{d.get('name') or 'The NVIDIA GPU'} (capability {d['capability']}) can store float8 weights but cannot compute "
               "in float8 (torch._scaled_mm needs 8.9+): FP8 checkpoints must be upcast to bfloat16/float16 to run.",
               "pipe.transformer.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)"
               "  # or model.to(torch.bfloat16)")


@rule("bf16_unsupported_gpu")
def _bf16(f: Facts) -> list[EnvFinding]:
    old = [d for d in gpus(f, "nvidia") if _capability(d) and compare(_capability(d), (8, 0)) < 0]
    if not old:
        return []
    d = old[0]
    return hit("bf16_unsupported_gpu", INFO,
               f"{d.get('name') or 'The NVIDIA GPU'} (capability {d['capability']}) has no native bfloat16: bf16 matmuls are "
               "emulated (slow) or fail. Use float16 there.",
               "model.to(torch.float16)  # torchdoctor.recommend_dtype(device) says the same")


@rule("rosetta_python")
def _rosetta(f: Facts) -> list[EnvFinding]:
    if not f["platform"]["rosetta"]:
        return []
    return hit("rosetta_python", WARNING,
               "This Python runs under Rosetta (x86_64) on Apple silicon: MPS is unavailable and everything is emulated.",
               "install an arm64 Python (python.org universal installer, or Homebrew in /opt/homebrew) and recreate the venv")


@rule("mps_unavailable")
def _mps(f: Facts) -> list[EnvFinding]:
    p = f["platform"]
    if p["system"] != "Darwin" or p["machine"] != "arm64" or p["rosetta"] or f["mps_available"]:
        return []
    mac = release(p.get("mac_ver"))
    if not f["torch"]["mps_built"]:
        why = f"torch {torch_v(f)} was built without MPS"
    elif mac and compare(mac, (12, 3)) < 0:
        why = f"macOS {p['mac_ver']} is older than 12.3"
    elif f["availability_source"] == "probe":
        why = "torch.backends.mps.is_available() is False"
    else:
        return []
    return hit("mps_unavailable", WARNING, f"Apple silicon, but MPS is unavailable: {why}.",
               "pip install --force-reinstall torch  # macOS arm64 wheels include MPS; macOS 12.3+ is needed")
