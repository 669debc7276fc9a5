"""Signatures and causes for families the twentieth collection's first run (session 29, issue 41 point 7) found
nothing for: torch's own warning that the GPU's compute capability is not in the build ("NVIDIA GeForce RTX 5090 with
CUDA capability sm_120 is not compatible with the current PyTorch installation"), flash-attn's refusal of a pre-Ampere
GPU ("FlashAttention only supports Ampere GPUs or newer."), oneDNN failing to set up a kernel on an Intel GPU ("could
not create a primitive", "could not create an engine"); and, weak, where the message is missing: a float8 dtype said
to be unsupported by a device or backend ("NotImplementedError for FP8 (e4m3fn) operators on RDNA4", "not supported
float8_e4m3fn on ppu backend", "float8 is natively supported on H100 (sm_90)"), a device mismatch said in words
("throw a \"device mismatch\" error", "a mismatch between the generated kernel's device and the input tensor's
device"), the tail of a dtype message whose head is cut ("`dtype c10::BFloat16, but got float`"), the GPU or its driver said not to be found in Chinese.

Every anchor but the Chinese words has a key (``prefilter.key_of``). The ``partial.`` signatures are weak (``sigs_frames.WEAK_PREFIXES``):
they speak only where no message does.
"""

from __future__ import annotations

from torchdoctor._explain import causes_device, causes_dtype  # noqa: F401  (causes reused)
from torchdoctor._explain.causes import define_cause as _c
from torchdoctor._explain.signatures import define as _sig

__all__: list[str] = []

_DEV, _NA, _BO, _UD = "device_mismatch", "no_accelerator", "backend_op_missing", "unsupported_dtype_on_device"

# --- torch's warning: the GPU's compute capability is not in this build ----------------------------------------------
# torch/cuda/__init__.py (_check_capability): "{name} with CUDA capability sm_{cc} is not compatible with the current
# PyTorch installation.\nThe current PyTorch install supports CUDA capabilities {arch list}." The first kernel launch
# then fails with "no kernel image is available"; users paste the warning alone as often as both.
_sig("no_accel.capability_not_in_build", _NA, "This PyTorch was built without kernels for this GPU's architecture",
     ("is not compatible with the current pytorch installation", "the current pytorch install supports cuda capab"),
     "The GPU[ ({gpu})] has compute capability[ {sm}], which the installed PyTorch was not built for[ (it has "
     "{arch})]: every CUDA kernel will fail with 'no kernel image is available'.",
     (("na.arch_not_in_build", 3.0),),
     r"(?P<gpu>[\w .-]{1,60}?) with CUDA capabilit(?:y|ies) (?P<sm>sm_\d{2,3}a?) is not compatible",
     r"supports CUDA capabilities (?P<arch>(?:sm_\d{2,3}a? ?){1,14})", confidence=0.9,
     alternatives=((_BO, 0.2, "a compiled extension built for other GPU architectures"),))

# --- flash-attn's architecture check -------------------------------------------------------------------------------
# flash_attn/csrc/flash_api.cpp: TORCH_CHECK(is_sm90 || is_sm8x, "FlashAttention only supports Ampere GPUs or newer.")
_sig("unsupported.flash_attn_arch", _UD, "FlashAttention-2 refuses a GPU older than Ampere",
     ("flashattention only supports ampere gpus or newer", "flash attention only supports ampere gpus or newer"),
     "flash-attn's FlashAttention-2 kernels run only on Ampere or newer GPUs (compute capability 8.0+); this GPU is "
     "older (Turing: T4, RTX 20xx, Quadro RTX; Volta: V100), so attention through flash-attn cannot run here.",
     (("ud.flash_attn_arch", 3.0),), confidence=0.9,
     alternatives=((_NA, 0.3, "a flash-attn build without kernels for this GPU"),))
_c("ud.flash_attn_arch",
   "FlashAttention-2 (the flash-attn package, and apps that call it: transformers' attn_implementation="
   "\"flash_attention_2\", vLLM's and ms-swift's flash switches, ComfyUI nodes) has kernels for compute capability "
   "8.0 and newer only. On a T4, V100 or RTX 20xx it raises this check whatever the dtype; switching the setting off "
   "helps only where the code path really avoids flash-attn.", "torchdoctor env",
   ("Use PyTorch's SDPA attention instead of FlashAttention-2",
    'model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")'),
   ("Check the GPU's compute capability (8.0 or newer is needed)",
    'python -c "import torch; print(torch.cuda.get_device_name(), torch.cuda.get_device_capability())"'),
   ("Or uninstall flash-attn so that libraries fall back to SDPA / xformers", "pip uninstall -y flash-attn"))

# --- oneDNN could not set up a kernel on an Intel GPU --------------------------------------------------------------
# oneDNN's C++ API wraps a failed status as "could not create a primitive" / "could not create an engine"; on Intel GPUs
# (IPEX, ipex-llm, torch's XPU build) that is the runtime, not the op: an iGPU beside the Arc card taking xpu:0, the
# OpenCL loader pointed elsewhere (OCL_ICD_VENDORS), a driver older than the oneAPI runtime. "could not create a
# primitive descriptor for ..." is another message (a layer's shapes or dtypes on the CPU) and is not read here.
_sig("no_accel.onednn_runtime", _NA, "oneDNN could not set up its kernel on the (Intel) GPU",
     ("could not create a primitive", "could not create an engine"),
     "oneDNN could not create[ {what}] on the device: on an Intel GPU this is the runtime setup (which GPU is "
     "xpu:0, the OpenCL / Level Zero loader, the driver), not the operation itself.",
     (("na.onednn_runtime", 3.0),), r"could not create (?P<what>a primitive|an engine)(?! descriptor)",
     require_pattern=True, confidence=0.65,
     alternatives=((_BO, 0.3, "oneDNN has no kernel for these inputs on this device"),))
_c("na.onednn_runtime",
   "With an integrated and a discrete Intel GPU both visible, the Arc card may not be xpu:0 and oneDNN fails to "
   "create its primitives there (an IPEX bug); an OCL_ICD_VENDORS setting that points the OpenCL loader elsewhere, "
   "or a GPU driver older than the oneAPI runtime torch ships, fails the same way.", "torchdoctor env",
   ("Expose only the discrete GPU (or disable the iGPU in the Device Manager)",
    "export ONEAPI_DEVICE_SELECTOR=level_zero:0  # Windows: set ONEAPI_DEVICE_SELECTOR=level_zero:0"),
   ("Let the runtime find its own OpenCL loader", "unset OCL_ICD_VENDORS"),
   ("See which devices torch finds", 'python -c "import torch; print([torch.xpu.get_device_name(i) for i in '
    'range(torch.xpu.device_count())])"'))

# --- words where the message is missing (weak) ----------------------------------------------------------------------
_FP8 = r"(?:float8\w{0,12}|fp8|e4m3\w{0,4}|e5m2\w{0,4})"
_sig("partial.fp8_unsupported_words", _UD, "A float8 dtype said to be unsupported by a device (said in words)",
     # each has a key that starts on a letter (a key starting on a digit would start inside a log's time stamp)
     ("supported float8", "support for float8", "float8 is natively", "fp8 not supported", "is unsupported",
      "is not supported on", "unsupported on"),
     "The text says a float8 dtype is not supported by the device or backend it runs on, without the kernel's own "
     "message: float8 math needs compute capability 8.9+ on NVIDIA, gfx942 (fnuz) or gfx950 / gfx12 on AMD, and "
     "does not exist on MPS.",
     (("ud.scaled_mm_capability", 3.0), ("ud.mps_fp8", 1.0)),
     rf"\b{_FP8}\b[^.\n]{{0,60}}?\b(?:not (?:currently )?supported|unsupported|isn't support\w{{0,3}}|is not support"
     rf"\w{{0,3}}|no support|not implemented|(?:only )?natively supported on)",
     rf"\b(?:not supported|unsupported|notimplementederror|no support for|isn't support\w{{0,3}} for|not implemented "
     rf"for)\b[^.\n]{{0,40}}?\b{_FP8}\b", require_pattern=True, confidence=0.45)
_sig("partial.device_mismatch_words", _DEV, "A device mismatch said in words",
     ("device mismatch", "mismatch between the"),
     "The text says tensors (or a kernel and its inputs) are on different devices, without PyTorch's own message.",
     (("dev.inputs_not_moved", 2.0), ("dev.created_inside", 1.5), ("dev.module_not_moved", 1.0)),
     r"\bdevice mismatch\b", r"\bmismatch between the [\w' ]{1,40}device and the [\w' ]{1,40}device\b",
     require_pattern=True, confidence=0.45)
# torch's dtype messages end "... dtype c10::BFloat16, but got float instead" (an op's out tensor, an argument); a
# title often keeps that tail only ("`dtype c10::BFloat16, but got float`")
_DTN = r"(?:c10::|torch\.)?(?:BFloat16|Half|Float|Double|float16|bfloat16|float32|float64|float|half|double)"
_sig("partial.dtype_but_got", "dtype_mismatch", "The tail of a dtype message (the message's head is cut)",
     ("dtype c10::", "dtype torch."),
     "The text keeps only the tail of PyTorch's dtype message: a tensor in[ {b}] met an operation that wanted[ {a}].",
     (("dt.out_cast", 2.0), ("dt.operand_cast", 2.0), ("dt.input_not_cast", 1.0)),
     rf"\bdtype (?P<a>{_DTN}), but got (?P<b>{_DTN})\b", require_pattern=True, confidence=0.45)
# the GPU or its driver said not to be found, in Chinese ("docker容器找不到nvidia驱动，找不到gpu"); CJK words hold no
# prefilter key, so these few anchors are found by a plain search
_sig("partial.no_gpu_words_zh", _NA, "No GPU or NVIDIA driver found (said in Chinese)",
     ("找不到nvidia驱动", "找不到gpu", "找不到显卡"),
     "The text says the GPU or its NVIDIA driver cannot be found (in Chinese), without PyTorch's own message: a "
     "container started without GPU access, a missing or too old driver, or a CPU-only torch.",
     (("na.no_driver", 2.5), ("na.cpu_build", 2.0)), confidence=0.45)
