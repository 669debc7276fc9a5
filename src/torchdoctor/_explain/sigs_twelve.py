"""Signatures and causes for families seen in public reports of 2025-2026 that nothing recognised: the size limits of
the MPS kernels (a dimension over INT_MAX, an NDArray over 4 GiB), an MPS kernel's "Unsupported datatype"
assertion, scaled_dot_product_attention left with no kernel, a checkpoint whose storages name a device this torch
cannot create ("Storage device not recognized: mps"), transformers' FlashAttention-2 refusal of float32, an Intel
GPU's bare "RuntimeError: UR error"; the words of these families when PyTorch's message is missing (a dtype mismatch
retold "(Float vs BFloat16)", a device mismatch retold, code said to assume CUDA, CUDA's "no kernel image" named in a
title, ROCm's HSA_OVERRIDE_GFX_VERSION named in a question); frames that are evidence alone (a numpy array sent
to mps or to the device, a dtype picked per device right before attention, torch.load restoring a storage); and a
cause for attention whose query and key/value differ in dtype: a KV cache made in another dtype than the model
computes in.

Every anchor has a key (``prefilter.key_of``): an anchor without one costs a search of the whole text.

The words and frames signatures are weak (``sigs_frames.WEAK_PREFIXES``): they speak only where no message does.
"""

from __future__ import annotations

from torchdoctor._explain import causes_device, causes_dtype  # noqa: F401  (the causes reused below)
from torchdoctor._explain.causes import ContextRule, register_rule
from torchdoctor._explain.causes import define_cause as _c
from torchdoctor._explain.signatures import DEV
from torchdoctor._explain.signatures import define as _sig

__all__: list[str] = []

_DEV, _DT, _UD, _BO = "device_mismatch", "dtype_mismatch", "unsupported_dtype_on_device", "backend_op_missing"
_DS, _NA = "deserialize_device", "no_accelerator"
_FROM_STACK = "The error message is missing or cut off; the stack alone shows "
_GUARD = "with torchdoctor.guard(model):\n    model(*inputs)"
# a paste of frames only: no "SomeError:" / "SomeException:" line in the lines after the matched source line that
# the window holds (``follow``)
_NO_ERROR_AFTER = r"(?![\s\S]{0,1800}?\w(?:Error|Exception):)"
_DTNAME = r"(?:torch\.)?(?:bfloat16|float16|float32|float64|float|half|double|bf16|fp16|fp32)"

# --- MPS: sizes and dtypes its kernels refuse -------------------------------------------------------------------
# MPSGraph's own check ("MPSGraph does not support tensor dims larger than INT_MAX") and Metal's NDArray limit
# ("[MPSNDArray initWithDevice:descriptor:] Error: total bytes of NDArray > 2**32")
_sig("backend.mps_size_limit", _BO, "A tensor is too large for the MPS kernels",
     ("does not support tensor dims larger than int_max", "does not support tensor dims greater than int_max",
      "total bytes of ndarray > 2**32"),
     "A tensor (or one of its dimensions) is larger than the MPS kernels of this macOS / torch can address.",
     (("bo.mps_size", 3.0), ("bo.mps_fallback", 0.5)), confidence=0.85,
     alternatives=((_UD, 0.2, "a smaller dtype halves the bytes but not the element count"),))
_c("bo.mps_size",
   "An MPS kernel got a tensor past its limits (one dimension over INT_MAX elements, or an NDArray over 4 GiB): "
   "a long video or audio latent, a high resolution, a large batch, or an attention score matrix on Apple "
   "silicon.", "torchdoctor env",
   ("Work in smaller pieces (a tiled VAE decode, fewer frames, a smaller batch or resolution)",
    "latents = torch.cat([vae.decode(c).sample for c in latents.split(1)])"),
   ("Or run that step on the CPU", 'out = fn(x.cpu()).to("mps")'),
   ("Or update torch and macOS (newer MPS kernels split large tensors)", "pip install -U torch torchvision"))

# a Metal kernel's assertion (the process aborts): ".../MPSNDArrayScaledDotProductAttention.mm:291: failed
# assertion `Unsupported datatype'"
_sig("unsupported.mps_kernel_dtype", _UD, "An MPS kernel refuses this dtype",
     ("unsupported datatype",),
     "The MPS kernel[ {kernel}] has no implementation for this dtype on this macOS / torch.",
     (("ud.mps_kernel_dtype", 3.0),),
     r"(?P<kernel>MPS\w{1,60})\.mm:\d{1,5}: failed assertion\W{0,3}Unsupported datatype", require_pattern=True,
     confidence=0.85, alternatives=((_BO, 0.3, "the kernel is missing for this dtype on this macOS"),))
_c("ud.mps_kernel_dtype",
   "The MPS kernel[ {kernel}] has no implementation for this dtype on this macOS: float16 / bfloat16 attention "
   "after a macOS upgrade, or integer inputs on an older macOS; float32 works.", "torchdoctor env",
   ("Run this model in float32 on MPS", "model.to(torch.float32)"),
   ("Or update torch (the MPS kernels follow macOS releases)", "pip install -U torch torchvision torchaudio"))

# --- attention ---------------------------------------------------------------------------------------------------
_sig("backend.sdpa_no_kernel", _BO, "scaled_dot_product_attention found no kernel for these inputs",
     ("no available kernel. aborting execution", "no viable backend for scaled_dot_product_attention"),
     "scaled_dot_product_attention had no allowed kernel (flash, memory-efficient, cuDNN, math) that takes these "
     "inputs on this device.",
     (("bo.sdpa_backends", 3.0),), confidence=0.85,
     alternatives=((_UD, 0.4, "the flash kernel takes only float16 / bfloat16 inputs and recent GPUs"),))
_c("bo.sdpa_backends",
   "The allowed attention backends were narrowed (torch.nn.attention.sdpa_kernel, the older sdp_kernel, "
   "enable_math_sdp(False)) to ones that refuse these inputs here: flash attention needs float16 / bfloat16 and "
   "an Ampere-or-newer GPU, memory-efficient attention has its own limits, and the math backend was switched "
   "off. The warnings before the error ('... kernel not used because ...') name the failed condition.", _GUARD,
   ("Allow the math backend as a fallback",
    "from torch.nn.attention import SDPBackend, sdpa_kernel\n"
    "with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):\n"
    "    out = F.scaled_dot_product_attention(q, k, v)"),
   ("Or give the flash kernel what it takes (float16 / bfloat16 inputs)",
    "q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))"))

# transformers' wordings ("Flash Attention 2.0 only supports torch.float16 and torch.bfloat16 dtypes. You passed
# torch.float32", an error in 4.x; "... dtypes, but the current dype in LlamaModel is torch.float32", a warning in
# 5.x); flash-attn's own is ``unsupported.flash_attn``
_sig("unsupported.hf_flash_dtype", _UD, "FlashAttention-2 runs only in float16 / bfloat16",
     ("only supports torch.float16 and torch.bfloat16",),
     "The FlashAttention-2 path got a model in[ {a}]: its kernels exist only for float16 and bfloat16.",
     (("ud.flash_fp32", 3.0),), r"You passed (?:torch\.)?(?P<a>float32|float64)",
     r"current d\w{0,2}pe in \w{1,60} is (?:torch\.)?(?P<a>float32|float64)", confidence=0.9,
     alternatives=((_DT, 0.2, "part of the model stayed in float32 after a half-precision load"),))

# query in one dtype, key and value in another: SDPA's message; where they came from is most often a cache
_c("dt.kv_cache_dtype",
   "The query is in the model's dtype but key and value are in another: a KV cache (past_key_values, a prompt "
   "cache) allocated or filled in another dtype — made before the model was cast, created with the default "
   "float32 or a dtype picked per device, written back by a cache compressor — or key/value from an encoder or "
   "adapter that was not cast.", _GUARD,
   ("Make the cache after the model's cast, in the dtype the model computes in",
    "cache = torch.zeros(shape, dtype=next(model.parameters()).dtype, device=device)"),
   ("Or cast key and value to the query's dtype before attention", "k, v = k.to(q.dtype), v.to(q.dtype)"))
register_rule(ContextRule("attention.qkv_dtypes",
                          words=("query, key, and value", "query, key and value", "query.dtype:", "query.dtype ="),
                          applies_to=(_DT,), boosts=(("dt.kv_cache_dtype", 3.0),)))

# --- checkpoints -------------------------------------------------------------------------------------------------
_sig("deserialize.storage_device", _DS, "A checkpoint's storages name a device this torch cannot create",
     ("storage device not recognized:",),
     "torch.load (or a storage move) met storages saved[ on {saved}], a device this PyTorch cannot create here.",
     (("ds.foreign_device", 3.0),), rf"storage device not recognized: (?P<saved>{DEV})", confidence=0.9,
     alternatives=((_NA, 0.35, "this torch build lacks the device the checkpoint names"),))
_c("ds.foreign_device",
   "The file was saved with tensors[ on {saved}] (mps on a Mac, xpu on an Intel GPU) and is loaded on a machine "
   "or build without that device: torch restores each storage on the device it was saved from unless told "
   "otherwise.", 'torchdoctor.scan("checkpoint.pt")',
   ("Map the storages when loading", 'state = torch.load(path, map_location="cpu")'),
   ("Or save device-free checkpoints", "torch.save({k: v.cpu() for k, v in model.state_dict().items()}, path)"))

# --- evidence without PyTorch's message (weak: see the module docstring) ------------------------------------------
_sig("frames.load_storage", _DS, "From the stack: torch.load failed while restoring a saved storage (message missing)",
     ("self.persistent_load(pid)", "restore_location(storage, location)"),
     _FROM_STACK + "torch.load restoring a saved tensor's storage (persistent_load / restore_location); that fails "
     "where the device it was saved from is not available and no map_location was given.",
     (("ds.foreign_device", 2.0),), confidence=0.45,
     alternatives=((_NA, 0.3, "this torch sees no GPU at all: a CPU-only build or a missing driver"),))
# a numpy array (float64 by default) sent to mps in a frame's source line
_sig("frames.numpy_to_mps", _UD, "From the stack: a numpy array sent to mps (message missing)",
     ("from_numpy(",),
     _FROM_STACK + "a numpy array turned into a tensor and moved to mps; numpy arrays are float64 by default and "
     "MPS has no float64.",
     (("ud.mps_fp64", 3.0),),
     r"from_numpy\([^\n]{0,200}?\)[^\n]{0,100}?(?:\.to\(|device\s?=)[^\n]{0,40}?[\"']mps", require_pattern=True,
     confidence=0.45)
# the same move with the device in a variable (a scheduler's set_timesteps: "torch.from_numpy(timesteps).to(device=
# device)"), in a paste of frames with no error line after them: the move fails only where float64 is missing
_sig("frames.numpy_to_device", _UD, "From the stack: a numpy array moved to the device (message missing)",
     ("from_numpy(",),
     _FROM_STACK + "a numpy array (float64 unless cast) turned into a tensor and moved to the device; that move "
     "fails on MPS, which has no float64 (on CUDA or the CPU it works).",
     (("ud.mps_fp64", 3.0),),
     r"from_numpy\([^\n]{0,200}?\)[^\n]{0,60}?\.to\((?:device\s?=\s?)?(?:self\.)?_?device\)"
     + _NO_ERROR_AFTER, require_pattern=True, follow=6, confidence=0.35,
     alternatives=((_NA, 0.3, "the device is a GPU this torch cannot use"),))
# a dtype picked per device (bfloat16 on cuda, float32 elsewhere) right before attention: a cache made in that
# dtype while the model computes in another
_sig("frames.sdpa_dtype_pick", _DT, "From the stack: attention after a dtype picked per device (message missing)",
     ("if device.type ==", "if device.type !=", "_available() else"),
     _FROM_STACK + "a dtype chosen by device type and then scaled_dot_product_attention; a tensor made in that "
     "dtype (a KV cache) meets a model computing in another.",
     (("dt.kv_cache_dtype", 3.0),),
     rf"{_DTNAME} if [^\n]{{1,80}}? else {_DTNAME}[\s\S]{{0,1200}}?scaled_dot_product_attention\(",
     require_pattern=True, follow=4, confidence=0.45)
# the words of a dtype error without PyTorch's message: "RuntimeError: Dtype mismatch (Float vs BFloat16) in ..."
_sig("partial.dtype_vs", _DT, "Two dtypes met in one operation (said in words)",
     ("dtype mismatch (",),
     "The text reports a dtype mismatch[ between {a} and {b}] without PyTorch's own message: two tensors of one "
     "operation are in different dtypes.",
     (("dt.input_not_cast", 2.0), ("dt.module_partially_cast", 1.5)),
     rf"dtype mismatch \((?P<a>{_DTNAME}) vs\.? (?P<b>{_DTNAME})\)", require_pattern=True, confidence=0.5)
# CUDA's "no kernel image" named in a title or cut short ("... causes \"no kernel image\" error")
_sig("partial.no_kernel_image", _NA, "A kernel with no build for this GPU (message cut or retold)",
     ("no kernel image",),
     "The text names CUDA's 'no kernel image' error: the GPU is there, but the torch build or an extension "
     "(flash-attn, xformers) has no kernel compiled for its architecture[ ({arch})].",
     (("na.arch_not_in_build", 3.0),), r"\b(?P<arch>sm_?\d{2,3})\b", confidence=0.5,
     alternatives=((_BO, 0.3, "a compiled extension was built for other GPU architectures"),))
# code said to need CUDA (or MPS, XPU) where there is none ("... assumes that a cuda device is available", "doesn't
# support torch if torch.cuda.is_available() = False", "torch.backends.mps.is_available() is False")
_sig("partial.cuda_assumed", _NA, "Code that needs a GPU where there is none (said in words)",
     ("assumes that a cuda device", "assumes a cuda device is available", "assumes cuda is available",
      "assumes that an mps device", "assumes that a mps device", "assumes an mps device is available",
      "assumes a mps device is available", "assumes mps is available", "assumes that an xpu device",
      "assumes that a xpu device", "assumes an xpu device is available", "assumes a xpu device is available",
      "assumes xpu is available",
      ".is_available() = false", ".is_available() == false", ".is_available() returns false",
      ".is_available() is false", ".is_available()` fails", ".is_available() fails", "._is_compiled` returns",
      "._is_compiled() returns", "._is_compiled returns"),
     "The text says the code needs a GPU[ ({dev})] on a machine or build without one: it assumes one is there, or "
     "fails where torch reports none.",
     (("na.hardcoded_cuda", 3.0), ("na.cpu_build", 1.0)),
     r"(?P<dev>cuda|mps|xpu)\.is_available\(\)", r"(?P<dev>cuda|mps|xpu)\._is_compiled\b[^\n]{0,20}?returns\W{0,3}false",
     r"assumes (?:that )?an? (?P<dev>cuda|mps|xpu) device",
     r"assumes (?P<dev>cuda|mps|xpu) is available", require_pattern=True, confidence=0.5)

# --- torchaudio transforms: nn.Modules whose kernel / window is made on the CPU when they are created -------------
_c("iw.transform_not_moved",
   "A torchaudio transform (Resample, MelSpectrogram, Spectrogram) is an nn.Module whose kernel, window or filter "
   "bank is made on the CPU when it is created; called on a waveform on the GPU it must be moved there too (or the "
   "waveform is float64 while its kernel is float32).", _GUARD,
   ("Move the transform to the waveform's device",
    "resample = torchaudio.transforms.Resample(orig_freq, new_freq).to(waveform.device)"),
   ("Or give it a float32 waveform", "waveform = waveform.float()"))
# the Resample conv's own frame: an input/weight error raised there is the transform's kernel, not a model's layer
register_rule(ContextRule("torchaudio.transform", words=("_apply_sinc_resample_kernel",),
                          applies_to=("input_weight_type_mismatch",), boosts=(("iw.transform_not_moved", 7.0),)))
_sig("frames.torchaudio_kernel", "input_weight_type_mismatch",
     "From the stack: torchaudio's resampling kernel at work (message missing)",
     ("_apply_sinc_resample_kernel(", "_get_sinc_resample_kernel("),
     _FROM_STACK + "torchaudio's Resample, whose sinc kernel is made on the CPU when the transform is created; a "
     "waveform on the GPU (or in float64) then meets that kernel in conv1d.",
     (("iw.transform_not_moved", 3.0),), confidence=0.45,
     alternatives=((_DEV, 0.4, "the same mix of devices raised by another op of the transform"),))

# --- Intel GPUs: the Unified Runtime's bare "RuntimeError: UR error" ----------------------------------------------
# raised by a kernel the XPU runtime could not run: a dtype conversion on the device ("t.to(torch.float16)"), a
# random op, a division; converting on the CPU and then moving works where the GPU or its driver lacks that kernel
_sig("unsupported.xpu_ur_error", _UD, "The Intel GPU runtime could not run a kernel (UR error)",
     ("runtimeerror: ur error",),
     "The Intel GPU runtime (Unified Runtime / Level Zero) failed to run a kernel on the XPU; nothing more is said.",
     (("ud.xpu_runtime_kernel", 3.0), ("ud.xpu_fp64", 1.0)), confidence=0.6,
     alternatives=((_NA, 0.4, "the GPU driver or a oneAPI runtime does not match this XPU build of torch"),
                   (_BO, 0.2, "this XPU build has no working kernel for the op")))
_c("ud.xpu_runtime_kernel",
   "The XPU has no working kernel for this dtype or op on this GPU and driver: a conversion on the device (to "
   "float16, bfloat16 or float64), a random fill or an arithmetic op that this GPU / driver combination cannot "
   "run. SYCL_UR_TRACE=1 shows the call that failed.", "torchdoctor env --probe",
   ("Make the tensor in the dtype on the CPU, then move it", 't = torch.randn(n, n).to(dtype).to("xpu")'),
   ("Or update the Intel GPU driver (and do not load another oneAPI runtime than the one torch came with)",
    "pip install -U torch --index-url https://download.pytorch.org/whl/xpu"))

# --- the words of placement errors when PyTorch's message is missing (weak) ----------------------------------------
# a device mismatch retold: "expect all tensor on the same device", "the tensor is on CPU while other tensors are on
# CUDA"
_sig("partial.device_words", _DEV, "Tensors on two devices met in one operation (said in words)",
     ("expect all tensor on the same device", "expect all tensors on the same device",
      "expect all tensors to be on the same device", "expected all tensor on the same device",
      "while other tensors are on "),
     "The text reports tensors on two devices in one operation[ ({a} and {b})] without PyTorch's own message.",
     (("dev.created_inside", 2.0), ("dev.module_not_moved", 1.5), ("dev.inputs_not_moved", 1.0)),
     rf"is on (?P<a>{DEV}) while other tensors are on (?P<b>{DEV})", confidence=0.5,
     alternatives=(("mixed_device_model", 0.3, "a model partly offloaded or dispatched over devices"),))
# ROCm's override named in a question or a report ("how to start with HSA_OVERRIDE_GFX_VERSION=10.3.0?"): a card
# outside the gfx targets of the ROCm build
_sig("partial.hsa_override", _NA, "An AMD GPU outside the ROCm build's targets (said in words)",
     ("hsa_override_gfx_version",),
     "The text names HSA_OVERRIDE_GFX_VERSION[ ({gfx})], ROCm's override for a GPU outside its build's targets: "
     "the AMD GPU is there, but the ROCm torch has no kernels for its gfx target.",
     (("na.rocm_arch", 3.0),), r"HSA_OVERRIDE_GFX_VERSION\W{1,3}(?P<gfx>\d{1,2}\.\d\.\d)", confidence=0.5,
     alternatives=((_BO, 0.3, "a compiled extension was built for other gfx targets"),))
