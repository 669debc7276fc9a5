"""Signatures and causes for families the nineteenth collection's first run (session 27, a second representative draw
of other plain queries) found nothing for: an older torch without ``torch.backends.mps``, CUDA's "no kernel image" as
its error code (``cudaErrorNoKernelImageForDevice``, code 209), a device index torch could not resolve ("The device
index is out of range. It must be in [0, 1), but got -1"), IPEX's AVX512 binary on a CPU without it, torch 1.x's
"is on CPU, but expected them to be on GPU" of an op's output and inputs, ``torch._scaled_mm``'s scale given in
another dtype ("scale_a must be float scalar"), a low-precision CUTLASS kernel this GPU cannot start ("cutlass cannot
initialize"), inductor's ``LoweringException`` for an op on 'mps'; and, weak, where the message is missing: CUDA said
not to be available in words ("CUDA is not available", "torch.cuda.is_available() return False", "=false"), tensors
said not to be moved to one device ("stack tensors from different devices", "tensors are on different gpu", "still on
cpu"), torch.load's map_location named as the fix ("Use `map_location` in `torch.load`"), a GPU said to lack float8
("on GPUs without native FP8 support").

Every anchor has a key (``prefilter.key_of``; the two camelCase identifiers through ``signatures.WRITTEN``). The
``partial.`` signatures are weak (``sigs_frames.WEAK_PREFIXES``): they speak only where no message does.
"""

from __future__ import annotations

from torchdoctor._explain import causes_device, causes_dtype  # noqa: F401  (causes reused)
from torchdoctor._explain.causes import define_cause as _c
from torchdoctor._explain.signatures import define as _sig

__all__: list[str] = []

_DEV, _DT, _NA, _BO = "device_mismatch", "dtype_mismatch", "no_accelerator", "backend_op_missing"
_UD, _DS = "unsupported_dtype_on_device", "deserialize_device"

# --- an older torch without the MPS backend -------------------------------------------------------------------------
# torch.backends.mps exists from torch 1.12; code that probes it on an older torch fails at the attribute
_sig("no_accel.backends_no_mps", _NA, "This PyTorch predates the MPS backend",
     ("module 'torch.backends' has no attribute 'mps'", "module 'torch' has no attribute 'mps'"),
     "The code probes torch's MPS backend, which the installed PyTorch does not have: it is older than 1.12 "
     "(torch.backends.mps) or 2.0 (torch.mps).",
     (("na.torch_without_mps", 3.0),), confidence=0.85)
_c("na.torch_without_mps",
   "The MPS backend (torch.backends.mps) arrived in PyTorch 1.12 and torch.mps in 2.0; the installed torch is older, "
   "so code that checks for Apple's GPU fails before it can fall back to the CPU.", "torchdoctor env",
   ("Install a PyTorch with the MPS backend", "pip install -U torch torchvision torchaudio"),
   ("Or guard the probe in code that must run on an older torch",
    "use_mps = getattr(torch.backends, 'mps', None) is not None and torch.backends.mps.is_available()"))

# --- CUDA's "no kernel image" as its error code ---------------------------------------------------------------------
# an extension's own CUDA check prints the runtime's enum and number: "code=209(cudaErrorNoKernelImageForDevice)"
_sig("no_accel.arch_code", _NA, "A kernel with no build for this GPU (CUDA error 209)",
     ("cudaErrorNoKernelImageForDevice",),  # as the runtime spells it: the prefilter keys that spelling
     "A CUDA kernel (of torch or, as the file named suggests, of a compiled extension[: {where}]) has no build for "
     "this GPU's architecture: the runtime's error 209, 'no kernel image is available'.",
     (("na.arch_not_in_build", 3.0),), r"(?P<where>[\w./-]{1,80}\.cu(?::\d{1,6})?)", confidence=0.85,
     alternatives=((_BO, 0.3, "a compiled extension was built for other GPU architectures"),))

# --- a device index torch could not resolve -------------------------------------------------------------------------
# torch 2.x: a bare device type ("xpu") reaching code that needs an index gives -1, a too-large index its number
_sig("no_accel.index_out_of_range", _NA, "A device index out of the range of devices",
     ("device index is out of range",),
     "A device index[ ({got})] is outside the devices this process has: a bare device type that reached code "
     "needing an index (-1), or an index beyond the device count.",
     (("na.ordinal", 3.0),), r"out of range\. It must be in \[0, \d{1,3}\), but got (?P<got>-?\d{1,3})",
     confidence=0.8,
     alternatives=((_DEV, 0.3, "a tensor placed on a device index the code did not mean"),))

# --- IPEX's AVX512 binary -------------------------------------------------------------------------------------------
_sig("no_accel.ipex_isa", _NA, "Intel Extension for PyTorch built for an instruction set this CPU lacks",
     ("the extension binary is avx512", "current machine does not support avx512"),
     "intel_extension_for_pytorch's CPU binary needs AVX512 and this CPU does not have it.",
     (("na.ipex_isa", 3.0),), confidence=0.9)
_c("na.ipex_isa",
   "The IPEX CPU wheels of 1.x were compiled for AVX512 and refuse to load on a CPU without it (most laptops and "
   "AMD CPUs before Zen 4).", "torchdoctor env",
   ("Run without IPEX on this CPU (plain PyTorch runs the same model)", "pip uninstall intel_extension_for_pytorch"),
   ("Or install a newer IPEX, whose CPU build picks its kernels at run time",
    "pip install -U intel_extension_for_pytorch"))

# --- torch 1.x: an op's output and inputs on the CPU where it wanted the GPU ----------------------------------------
_sig("device.expected_them_on", _DEV, "Tensors of one operation not on the device it runs on (torch 1.x wording)",
     ("but expected them to be on gpu", "but expected them to be on cpu", "but expected it to be on gpu"),
     "An operation[ ({op})] found a tensor on one device where it runs on another: torch 1.x's check of an op's "
     "output and inputs.",
     (("dev.inputs_not_moved", 2.0), ("dev.module_not_moved", 1.5), ("dev.created_inside", 1.0)),
     r"\(while checking arguments for (?P<op>\w{1,40})\)", confidence=0.8)

# --- torch._scaled_mm's scales in another dtype ---------------------------------------------------------------------
_sig("dtype.scaled_mm_scale", _DT, "A float8 matmul given its scale in another dtype",
     ("scale_a must be float scalar", "scale_b must be float scalar", "scale_result must be a float scalar"),
     "torch._scaled_mm wants its scales as float32 tensors; one came in another dtype[ ({which})], as when a "
     "whole-model cast to bf16 or fp16 also cast the float8 layers' scales.",
     (("dt.scaled_mm_scale", 3.0),), r"(?P<which>scale_\w{1,6}) must be (?:a )?float scalar", confidence=0.85)
_c("dt.scaled_mm_scale",
   "A model cast with model.to(torch.bfloat16) (or .half()) casts every floating buffer, the float8 layers' scale "
   "buffers included; torch._scaled_mm requires float32 scales.", "with torchdoctor.guard(): ...",
   ("Keep the float8 scales in float32 after the cast",
    "model = model.to(torch.bfloat16)\nfor name, buf in model.named_buffers():\n"
    "    if 'scale' in name:\n        buf.data = buf.data.float()"),
   ("Or cast before converting the layers to float8", "model = convert_to_float8_training(model.to(torch.bfloat16))"))

# --- a low-precision CUTLASS kernel refused by the GPU -------------------------------------------------------------
# torch._scaled_mm with rowwise scales runs a CUTLASS kernel built for Hopper (sm90); on another GPU it throws a bare
# "cutlass cannot initialize" (pytorch#130359), as do other CUTLASS kernels built for one architecture (torchao's int4)
_sig("unsupported.cutlass_init", _UD, "A low-precision CUTLASS kernel this GPU cannot run",
     ("cutlass cannot initialize", "cutlass cannot implement"),
     "A CUTLASS kernel could not start on this GPU: torch._scaled_mm's float8 kernel with rowwise scales (and other "
     "low-precision CUTLASS kernels) is built for Hopper (compute capability 9.0) or another architecture only.",
     (("ud.scaled_mm_capability", 3.0),), confidence=0.7,
     alternatives=((_BO, 0.5, "an extension's CUTLASS kernel built for other GPUs or shapes"),))

# --- torch.compile's inductor lowering an op for Apple's GPU --------------------------------------------------------
# inductor's "LoweringException: ..." over an IR dump whose device is 'mps': its MPS backend came late (many ops had no
# lowering before torch 2.8)
_sig("backend_op.inductor_mps", _BO, "torch.compile could not lower an op for the MPS device",
     ("LoweringException",),  # as inductor spells it: the prefilter keys that spelling
     "torch.compile's inductor could not lower an op[ ({op})] for the MPS device: its Apple GPU backend lacks it in "
     "this PyTorch.",
     (("bo.inductor_mps", 3.0),),
     r"LoweringException:[\s\S]{0,300}?target: (?P<op>[\w.]{1,60})[\s\S]{0,600}?'mps'",
     r"LoweringException:[\s\S]{0,900}?'mps'", require_pattern=True, follow=12, confidence=0.75)
_c("bo.inductor_mps",
   "torch.compile's inductor backend for Apple GPUs is young: before PyTorch 2.8 many ops have no MPS lowering, so "
   "compiling a model on 'mps' fails where eager mode runs.", "torchdoctor env",
   ("Update PyTorch (2.8 or later lowers far more ops for MPS)", "pip install -U torch torchvision"),
   ("Or compile only off MPS", "if device.type != \"mps\":\n    model = torch.compile(model)"),
   ("Or let the compiler fall back to eager where it fails",
    "import torch._dynamo\ntorch._dynamo.config.suppress_errors = True"))

# --- words where the message is missing (weak) ----------------------------------------------------------------------
_sig("partial.cuda_unavailable_words", _NA, "CUDA said not to be available (said in words)",
     ("cuda is not available", "cuda is not availabel", "cuda isn't available", "cuda isnt available",
      ".is_available() return false", ".is_available()=false", ".is_available() returned false",
      ".is_available()返回false"),
     "The text says torch sees no CUDA device without an error of its own: the installed torch is a CPU-only build "
     "or one for a CUDA the driver does not run, or the process cannot see the GPU.",
     (("na.cpu_build", 2.5), ("na.no_driver", 2.0), ("na.hardcoded_cuda", 1.0)), confidence=0.45)
_sig("partial.device_words_unmoved", _DEV, "Tensors said not to be moved to one device (said in words)",
     ("tensors from different devices", "not being moved to same device", "not being moved to the same device",
      "tensors not on the same device", "tensors are on different gpu", "tensors on different gpu",
      "tensors are still on cpu", "tensor is still on cpu", "tensors are still on the cpu", "locates in cpu"),
     "The text says tensors of one computation are left on different devices, without PyTorch's own message.",
     (("dev.inputs_not_moved", 2.0), ("dev.created_inside", 1.5), ("dev.module_not_moved", 1.0)), confidence=0.45)
_sig("partial.map_location_words", _DS, "torch.load's map_location named as the fix (said in words)",
     ("map_location",),
     "The text names torch.load's map_location as what was missing, without torch.load's own message: a checkpoint "
     "saved on a GPU was loaded where that GPU is not available.",
     (("ds.cpu_only_load", 3.0), ("ds.gpu_invisible", 1.0)),
     # advice in words ("Use `map_location` in `torch.load`", "Passing map_location solves this error"), never the
     # keyword in code ("map_location='cpu'", which a paste of any torch.load call holds)
     r"\b(?:pass\w{0,3}|use|using|add\w{0,3}|without|set\w{0,3}|specify\w{0,4}|need\w{0,2}|missing|forgot\w{0,3})"
     r"\W{1,3}(?:the |a )?map_location\b(?!`? ?=)",
     r"\bmap_location`? (?:solves|fixes|fixed|solved)\b", require_pattern=True, confidence=0.45)
_sig("partial.fp8_gpu_words", _UD, "A GPU said to lack float8 (said in words)",
     ("without native fp8", "without native float8", "no native fp8", "no native float8", "without fp8 support",
      "doesn't support fp8", "does not support fp8", "don't support fp8", "do not support fp8"),
     "The text says the GPU has no float8 support, without the kernel's own message: float8 math (torch._scaled_mm, "
     "a float8 cast compiled by Triton) needs compute capability 8.9 or newer.",
     (("ud.scaled_mm_capability", 3.0), ("ud.mps_fp8", 1.0)), confidence=0.45)
