"""Signatures and causes for families seen in public reports that nothing recognised (the thirteenth and fourteenth
held-out collections' first runs): FSDP refusing where a module's parameters are (CPU offloading, one device per
module), torch's autocast refusing bfloat16 on a GPU without it, torch.utils.cpp_extension finding no CUDA toolkit
(CUDA_HOME), sparse tensors on MPS / XPU (the "SparseMPS" dispatch key), CTranslate2 (faster-whisper, whisperX)
refusing a compute type or CUDA; and the words of these families when the message is missing: an op named as
unsupported on MPS / XPU, a dtype named as unsupported with MPS / XPU, CUDA asked for on a Mac or said to be absent,
a script's own print that CUDA is not there, a float16 compute type used off an NVIDIA GPU.

Every anchor has a key (``prefilter.key_of``): an anchor without one costs a search of the whole text.

The words signatures are weak (``sigs_frames.WEAK_PREFIXES``): they speak only where no message does.
"""

from __future__ import annotations

from torchdoctor._explain import causes_device, causes_dtype, causes_extra  # noqa: F401  (the causes reused below)
from torchdoctor._explain.causes import ContextRule, register_rule
from torchdoctor._explain.causes import define_cause as _c
from torchdoctor._explain.signatures import DEV
from torchdoctor._explain.signatures import define as _sig

__all__: list[str] = []

_UD, _BO, _NA, _MD = "unsupported_dtype_on_device", "backend_op_missing", "no_accelerator", "mixed_device_model"
_GUARD = "with torchdoctor.guard(model):\n    model(*inputs)"

# --- FSDP: where a wrapped module's parameters may be ---------------------------------------------------------------
# torch.distributed.fsdp's own checks: "An FSDP-managed module with parameter CPU offloading enabled has parameters
# on cuda:0. Make sure to not move the module from CPU when offloading parameters.", "An FSDP-managed module
# unexpectedly has parameters on cpu. Make sure to move the module to cuda:0 before training.", "FSDP only supports
# single device modules but got params on {...}", "FSDP does not support modules with different device types but got
# params on cuda and cpu", "To support a module with both CPU and GPU params, please pass in device_id argument."
_sig("mixed.fsdp_param_device", _MD, "FSDP found the module's parameters on a device it does not allow",
     ("fsdp-managed module with parameter cpu offloading enabled has parameters on",
      "fsdp-managed module unexpectedly has parameters on",
      "fsdp only supports single device modules but got params on",
      "fsdp does not support modules with different device types",
      "to support a module with both cpu and gpu params"),
     "FSDP found the wrapped module's parameters[ on {dev}], where its settings do not allow them: with parameter "
     "CPU offloading they must stay on the CPU, without it they must be on the compute device, and a module with "
     "parameters on two devices needs device_id.",
     (("md.fsdp_placement", 3.0),),
     rf"has parameters on (?P<dev>{DEV})", rf"got params on \{{[^}}\n]{{0,80}}?(?P<dev>{DEV})",
     rf"got params on (?P<dev>{DEV}) and", confidence=0.9)
_c("md.fsdp_placement",
   "The module was moved before (or after) FSDP wrapped it against FSDP's settings: .cuda() / .to(device) on a "
   "model wrapped with CPUOffload(offload_params=True) (FSDP keeps the shards on the CPU and moves them itself), a "
   "model left on the CPU without offloading, or a model with some parameters on the GPU and the rest on the CPU "
   "wrapped without device_id. Trainer configs (NeMo, Lightning, accelerate) do this when both a device placement "
   "and CPU offloading are switched on.", "torchdoctor.scan(model)",
   ("With CPU offloading: wrap the module while it is on the CPU and do not move it yourself",
    "model = FSDP(model, cpu_offload=CPUOffload(offload_params=True), device_id=torch.cuda.current_device())"),
   ("Without offloading: let FSDP move the module to its GPU (device_id), or move it there before wrapping",
    "model = FSDP(model, device_id=local_rank)"))

# --- torch's autocast refusing bfloat16 on a GPU without it -------------------------------------------------------
# "RuntimeError: Current CUDA Device does not support bfloat16. Please switch dtype to float16." (torch.amp): the
# GPU's own limit, so it comes first among the errors of one paste (an error that follows a workaround, "if I cast
# to float16 then ...", is its consequence)
_sig("unsupported.autocast_bf16", _UD, "autocast asked for bfloat16 on a GPU without it",
     ("current cuda device does not support bfloat16",),
     "torch.autocast was asked for bfloat16 on a CUDA GPU below compute capability 8.0 (T4, V100, GTX/RTX 20xx), "
     "which has no bfloat16 support.",
     (("ud.bf16_old_gpu", 3.0),), confidence=0.97,
     alternatives=(("dtype_mismatch", 0.3, "casting only the input to float16 leaves float32 weights behind"),))

# --- torch.utils.cpp_extension with no CUDA toolkit -----------------------------------------------------------------
# "OSError: CUDA_HOME environment variable is not set. Please set it to your CUDA install root." raised when a
# package builds (or JIT-compiles) its CUDA extension: on a Mac or a CPU-only machine there is no CUDA at all
_sig("noaccel.cuda_home", _NA, "A CUDA extension was built where there is no CUDA toolkit",
     ("cuda_home environment variable is not set",),
     "A package compiles a CUDA extension (torch.utils.cpp_extension) and found no CUDA toolkit: CUDA_HOME is not "
     "set and no nvcc was found.",
     (("na.cuda_toolkit", 3.0), ("na.mac", 1.0)), confidence=0.9,
     alternatives=((_BO, 0.3, "the package's compiled CUDA kernels are unavailable here"),))
_c("na.cuda_toolkit",
   "The package builds its own CUDA kernels when imported or installed (an exllama / GPTQ / flash-attn style "
   "extension), which needs NVIDIA's CUDA toolkit (nvcc). On a Mac or a machine without an NVIDIA GPU there is no "
   "CUDA toolkit to find; on a GPU machine only the driver (not the toolkit) is installed, or CUDA_HOME is not "
   "set.", "torchdoctor env",
   ("On a Mac or without an NVIDIA GPU: use a loader or package version that does not need the CUDA extension",
    "pip uninstall <the package that builds the CUDA extension>"),
   ("On an NVIDIA machine: install the CUDA toolkit matching torch.version.cuda and point CUDA_HOME at it",
    "export CUDA_HOME=/usr/local/cuda"))

# --- sparse tensors on MPS / XPU ------------------------------------------------------------------------------------
# "`aten::empty.memory_format` is not implemented for `SparseMPS`" (the message retold): a sparse buffer (whisper's
# alignment heads, a graph's adjacency) moved with the model
_sig("backend.sparse_device", _BO, "A sparse tensor on a device without sparse kernels",
     ("implemented for `sparse", "implemented for 'sparse", 'implemented for "sparse', "implemented for sparse"),
     "A sparse tensor was moved to (or made on)[ {dev}] a device whose PyTorch has no kernels for sparse layouts[ "
     "({op})].",
     (("bo.sparse_device", 3.0),),
     r"(?P<op>aten::\w{1,60}(?:\.\w{1,30})?)\W{1,4}(?:is )?not implemented for\W{1,4}Sparse(?P<dev>MPS|XPU)\b",
     r"not implemented for\W{1,4}Sparse(?P<dev>MPS|XPU)\b", require_pattern=True, confidence=0.9,
     alternatives=((_UD, 0.2, "the sparse layout, not the dtype, is what the device lacks"),))
_c("bo.sparse_device",
   "A sparse tensor (torch.sparse_coo_tensor: whisper's alignment_heads buffer, a graph's adjacency matrix) is "
   "moved with the model to MPS / XPU, whose PyTorch has no kernels (or few) for sparse layouts.", _GUARD,
   ("Keep the sparse tensor on the CPU (or make it dense) before moving the model",
    "buf = buf.to_dense()  # or keep it on the CPU and move only dense results"),
   ("Or run that model on the CPU", 'model.to("cpu")'),
   ("Or update torch (sparse MPS kernels are being added)", "pip install -U torch"))
# PyTorch's own "Could not run '...' with arguments from the 'SparseMPS' backend" stays backend.could_not_run's; its
# first cause is this one
register_rule(ContextRule("sparse_device", words=("sparsemps", "sparsexpu"), applies_to=(_BO,),
                          boosts=(("bo.sparse_device", 6.0),)))

# --- the words of these families when PyTorch's message is missing (weak) --------------------------------------------
# an op named as unsupported on a device: "Unsupported Ops in MPS: _upsample_bilinear2d_aa", "op not supported on
# XPU: aten::linalg_qr"
_sig("partial.op_unsupported_words", _BO, "An op without a kernel on this device (said in words)",
     ("unsupported ops in mps", "unsupported ops on mps", "unsupported op on mps", "unsupported ops in xpu",
      "unsupported ops on xpu", "unsupported op on xpu",
      "op not supported on mps", "ops not supported on mps", "op is not supported on mps",
      "ops are not supported on mps", "op not supported on xpu", "ops not supported on xpu"),
     "The text names an op as unsupported on[ {dev}] this device[ ({op})] without PyTorch's own message: the op has "
     "no kernel there in this PyTorch.",
     (("bo.op_named_missing", 3.0),),
     r"unsupported op(?:erator)?s? (?:in|on) (?:the )?(?P<dev>mps|xpu)\b(?:\W{1,4}(?P<op>(?:aten::)?_?[a-z]\w{2,60}))?",
     r"ops? (?:is |are )?not supported on (?:the )?(?P<dev>mps|xpu)\b(?:\W{1,4}(?P<op>(?:aten::)?_?[a-z]\w{2,60}))?",
     require_pattern=True, confidence=0.5)
_c("bo.op_named_missing",
   "An op[ ({op})] has no kernel for this device in this PyTorch (MPS and XPU gain kernels with each release).",
   _GUARD,
   ("Let unsupported ops fall back to the CPU (MPS)", "export PYTORCH_ENABLE_MPS_FALLBACK=1"),
   ("Or run that step on the CPU", "out = fn(x.cpu()).to(x.device)"),
   ("Or update torch", "pip install -U torch torchvision"))
# a dtype named as unsupported with a device: "Unsupported BFloat16 Data Type Issue with MPS Backend", "MPS:
# unsupported float64", "pytorch only supports float32 for MPS"
_DTW = r"(?P<dtype>bfloat16|bf16|float64|fp64|double|float8\w{0,8}|fp8)"
_sig("partial.dtype_device_words", _UD, "A dtype the device does not have (said in words)",
     ("unsupported bfloat16", "unsupported bf16", "unsupported float64", "unsupported double",
      "unsupported float8", "unsupported fp8", "bfloat16 unsupported", "float64 unsupported",
      "bfloat16 is unsupported", "float64 is unsupported", "only supports float32 for mps",
      "only supports float32 on mps", "only supports float32 for xpu", "only supports float32 on xpu",
      "mps only supports float32", "xpu only supports float32", "mps does not support float64",
      "mps doesn't support float64", "float64 not supported", "float64 is not supported", "bfloat16 not supported"),
     "The text names[ {dtype}] a dtype as unsupported with[ {dev}] the device without PyTorch's own message.",
     (("ud.mps_bf16", 1.0), ("ud.mps_fp64", 1.0), ("ud.xpu_fp64", 0.8), ("ud.mps_fp8", 0.8)),
     rf"unsupported {_DTW}\b[^\n]{{0,60}}?\b(?P<dev>mps|xpu)\b",
     rf"\b(?P<dev>mps|xpu)\b[^\n]{{0,60}}?unsupported {_DTW}",
     rf"{_DTW} (?:is )?unsupported (?:on|in|by|with) (?:the )?(?P<dev>mps|xpu)\b",
     rf"\b(?P<dev>mps|xpu)\b[^\n]{{0,60}}?{_DTW}\W{{0,3}}(?:is )?unsupported",
     r"only supports? float32 (?:for|on|in) (?:the )?(?P<dev>mps|xpu)\b", r"\b(?P<dev>mps|xpu) only supports? float32",
     r"\b(?P<dev>mps) (?:does not|doesn't) support (?P<dtype>float64)",
     rf"\b(?P<dev>mps|xpu)\b[^\n]{{0,80}}?{_DTW} (?:is )?not supported",
     rf"{_DTW} (?:is )?not supported (?:on|in|by) (?:the )?(?P<dev>mps|xpu)\b", require_pattern=True,
     confidence=0.5)
# CUDA asked for on a Mac, said in words: "Attempt to initialize CUDA on Apple Silicon", "trying to use cuda on an M1"
# (the anchors hold a verb: "cuda on mac" alone has no prefilter key; few verbs, each new key costs every scan a little)
_sig("partial.cuda_on_mac", _NA, "CUDA asked for on a Mac (said in words)",
     ("cuda on apple silicon", "initialize cuda on", "attempting to use cuda on", "trying to use cuda on"),
     "The text says CUDA is asked for on a Mac[ ({where})]: there is no CUDA there; Apple GPUs are the 'mps' device.",
     (("na.mac", 3.0), ("na.hardcoded_cuda", 2.0)),
     r"cuda on (?:an? )?(?P<where>apple silicon\w{0,2}|apple m\d|mac(?:os|book\w{0,4})?|m[1-5](?: \w{3,5})?)\b",
     require_pattern=True, confidence=0.5)
# a script's own print that CUDA is not there, right before a cut traceback: llama's "Is CUDA supported by this
# system?False", "CUDA available? False" (collect_env's "Is CUDA available: False" is left out: every environment
# dump of a Mac or an XPU machine carries it, whatever the error)
_sig("partial.cuda_reported_false", _NA, "The script reports no CUDA (message missing)",
     ("supported by this system?false", "supported by this system? false", "cuda available? false",
      "cuda is available? false"),
     "The script printed that CUDA is not available here and then failed; the error message itself is missing.",
     (("na.hardcoded_cuda", 3.0), ("na.mac", 1.0), ("na.cpu_build", 1.0)), confidence=0.45)

# --- CTranslate2 (faster-whisper, whisperX): a compute type the device has no kernels for ---------------------------
# "ValueError: Requested float16 compute type, but the target device or backend do not support efficient float16
# computation." (CTranslate2's own check; also int8_float16 / bfloat16): the CPU, a Mac, a Pascal GPU
_sig("unsupported.ctranslate2_compute_type", _UD, "CTranslate2 was asked for a compute type this device lacks",
     ("compute type, but the target device or backend",),
     "CTranslate2 (faster-whisper, whisperX) was asked for the[ {ctype}] compute type on a device or backend that has "
     "no efficient kernels for it.",
     (("ud.ctranslate2_compute_type", 3.0),),
     r"Requested (?P<ctype>\w{1,20})\s{1,40}compute type", confidence=0.95,
     alternatives=((_NA, 0.3, "the model was meant for an NVIDIA GPU this machine does not have"),))
_c("ud.ctranslate2_compute_type",
   "faster-whisper / whisperX run on CTranslate2, whose float16 (and int8_float16, bfloat16) compute types need a "
   "recent NVIDIA GPU: the CPU, a Mac (CTranslate2 has no MPS backend) and older NVIDIA GPUs (Pascal, GTX 10xx, "
   "for float16; pre-Ampere for bfloat16) refuse them; int8 or float32 run everywhere.", "torchdoctor env",
   ("Ask CTranslate2 what this device supports",
    'import ctranslate2\nprint(ctranslate2.get_supported_compute_types(device))'),
   ("Pick the compute type by device", 'compute_type = "float16" if device == "cuda" else "int8"'),
   ("Or let CTranslate2 choose", 'model = WhisperModel(size, device=device, compute_type="default")'))
# "ValueError: This CTranslate2 package was not compiled with CUDA support" (device="cuda" on a Mac or a CPU wheel)
_sig("noaccel.ctranslate2_no_cuda", _NA, "CTranslate2 was asked for CUDA but this build has none",
     ("ctranslate2 package was not compiled with cuda support",),
     "CTranslate2 (faster-whisper, whisperX) was asked for device='cuda', but the installed package has no CUDA.",
     (("na.ctranslate2_cpu_build", 3.0), ("na.mac", 1.0)), confidence=0.95)
_c("na.ctranslate2_cpu_build",
   "The installed CTranslate2 is a CPU-only build (every macOS wheel; a CPU wheel on Linux / Windows) while the code "
   "asks it for device='cuda' (often hard-coded next to compute_type='float16').", "torchdoctor env",
   ("Run faster-whisper on the CPU here", 'model = WhisperModel(size, device="cpu", compute_type="int8")'),
   ("Or, on an NVIDIA machine, install the CUDA build of CTranslate2 that matches the CUDA / cuDNN libraries",
    "pip install -U ctranslate2"))
# the same said in words ("compute_type is hardcoded to float16 ... a ValueError on any non-CUDA device")
_sig("partial.ctranslate2_float16_words", _UD, "A float16 compute type asked for off an NVIDIA GPU (said in words)",
     ("compute_type",),
     "The text says a float16 compute type is used where there is no NVIDIA GPU, without CTranslate2's own message.",
     (("ud.ctranslate2_compute_type", 3.0),),
     r"compute_type[^\n]{0,120}?float16[^\n]{0,200}?(?:non-CUDA|CPU|Apple|Mac|M[1-5]\b|without an? NVIDIA)",
     require_pattern=True, confidence=0.55)
# a machine without CUDA, said in words ("Mac users don't have Cuda", "fails on machines without CUDA (e.g. M1 Macs)")
_sig("partial.no_cuda_words", _NA, "Code that needs CUDA where there is none (said in words)",
     ("don't have cuda", "doesn't have cuda", "dont have cuda", "does not have cuda", "machines without cuda",
      "machine without cuda"),
     "The text says the code is run where there is no CUDA: it assumes an NVIDIA GPU that this machine does not "
     "have.",
     (("na.hardcoded_cuda", 3.0), ("na.mac", 1.5)), confidence=0.45)

# --- torch.distributed: a collective on a device its backend does not serve ----------------------------------------
# gloo's own checks: "ProcessGroupGloo::allgather: invalid tensor type at index 0 (expected TensorOptions(dtype=long
# int, device=cpu, ...), got TensorOptions(dtype=long int, device=mps:0, ...))", "ProcessGroupGloo::allreduce:
# unsupported device type mps"; c10d's "No backend type associated with device type mps"
_sig("device.collective_backend", "device_mismatch", "A collective on a device its distributed backend does not serve",
     ("processgroupgloo::", "no backend type associated with device type"),
     "A torch.distributed collective[ ({op})] got tensors on[ {b}] a device its backend does not move[ (it expects "
     "{a})].",
     (("dev.collective_backend", 3.0),),
     rf"ProcessGroupGloo::(?P<op>\w{{1,40}}): invalid tensor type[\s\S]{{0,240}}?device=(?P<a>{DEV})[\s\S]{{0,400}}?"
     rf"got TensorOptions\([^\n]{{0,80}}?device=(?P<b>{DEV})",
     rf"ProcessGroupGloo::(?P<op>\w{{1,40}}): unsupported device type (?P<b>\w{{1,20}})",
     r"No backend type associated with device type (?P<b>\w{1,20})", require_pattern=True, confidence=0.9,
     alternatives=((_BO, 0.4, "the backend has no collectives for this device at all"),
                   (_UD, 0.2, "gloo also refuses some dtypes")))
_c("dev.collective_backend",
   "torch.distributed's gloo backend moves CPU (and CUDA) tensors only, NCCL CUDA tensors only: a model on MPS (a "
   "Mac) or XPU wrapped in DistributedDataParallel, or an all_gather / all_reduce of its tensors, hands the process "
   "group device tensors it cannot send (trainers do this when they start DDP with backend='gloo' on one Mac).",
   _GUARD,
   ("Run the collective on CPU copies and move the result back",
    "out = [torch.empty_like(t, device=\"cpu\") for _ in range(world)]\ndist.all_gather(out, t.cpu())\n"
    "t_all = torch.stack(out).to(t.device)"),
   ("On one Mac, do not start DDP at all (one process needs no collectives)", 'model = model.to("mps")'),
   ("On Intel GPUs use the XPU backend", 'dist.init_process_group("xccl")'))

# --- diffusers' model offload with no accelerator -------------------------------------------------------------------
# "RuntimeError: `enable_model_cpu_offload` requires accelerator, but not found" (also enable_sequential_cpu_offload)
_sig("noaccel.diffusers_offload", _NA, "Model offload asked for where there is no accelerator",
     ("requires accelerator, but not found",),
     "diffusers' [{how} ]CPU offload was switched on, but no accelerator (CUDA, XPU, MPS) was found to offload to.",
     (("na.offload_no_accelerator", 3.0),), r"`?(?P<how>enable_\w{1,30}_cpu_offload)`? requires accelerator",
     confidence=0.95)
_c("na.offload_no_accelerator",
   "enable_model_cpu_offload / enable_sequential_cpu_offload move each model to the accelerator when it runs and back "
   "to the CPU after; with no GPU here (a CPU-only server, a container without GPU access, a CPU build of torch) "
   "there is nowhere to move it, so diffusers refuses. Code that calls it unconditionally fails on every CPU-only "
   "machine.", "torchdoctor env",
   ("Switch offload on only where an accelerator is there",
    "if torch.cuda.is_available() or torch.backends.mps.is_available():\n    pipe.enable_model_cpu_offload()\n"
    "else:\n    pipe.to(\"cpu\")"))
