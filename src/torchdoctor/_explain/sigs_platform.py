"""Signatures and causes for refusals of one platform build or library version, each a wording seen across public
reports of 2025-2026: an MPS kernel's limits (more than 65536 output channels, Conv3D) and an MPS kernel that takes
floating types only before a macOS release; a ROCm (HIP) torch without kernels for the AMD GPU's gfx target
("invalid device function"); ``from_pretrained`` under a meta device context (transformers' warning, then its
error); ``.to()`` on a bitsandbytes model refused for the installed bitsandbytes / accelerate; and an op's own
pair-wise device check ("expected self and mask to be on the same device").
"""

from __future__ import annotations

from torchdoctor._explain import causes_dtype  # noqa: F401  (its na.directml: the rule below lowers it)
from torchdoctor._explain.causes import ContextRule, register_rule
from torchdoctor._explain.causes import define_cause as _c
from torchdoctor._explain.signatures import DEV
from torchdoctor._explain.signatures import define as _sig

__all__: list[str] = []

_DEV, _UD, _MIX = "device_mismatch", "unsupported_dtype_on_device", "mixed_device_model"
_NA, _BO, _Q = "no_accelerator", "backend_op_missing", "quantization_device"

# the op exists on MPS but refuses this case: a convolution with more than 65536 output channels (lifted on macOS
# 15 with a recent torch), a 3D convolution on an older macOS / torch
_sig("backend.mps_limit", _BO, "An MPS kernel refuses this case on this macOS / torch",
     ("not supported at the mps device", "conv3d is not supported on mps",
      "output channels > 65536 not supported"),  # the last: the message cut before "at the MPS device" (a title)
     "The MPS kernel of this torch and macOS refuses the case[ ({what})]: the op runs on MPS, but not with these "
     "arguments here.",
     (("bo.mps_limit", 3.0), ("bo.mps_fallback", 1.0)),
     r"(?P<what>Output channels > \d{1,7}|Conv3D)\s+(?:is\s+)?not supported(?: (?:at|on) (?:the )?MPS)?",
     confidence=0.9,
     alternatives=((_NA, 0.3, "the Mac's macOS is older than the MPS features this model needs"),))
_c("bo.mps_limit",
   "A layer of the model hits a limit of the MPS kernels of this torch and macOS: a convolution with more than "
   "65536 output channels (a vocoder's or an audio VAE's wide conv; macOS 15 with a recent torch lifts it), or a "
   "3D convolution (video and volume models) on a macOS or torch too old for it.", "torchdoctor env",
   ("Let the refused op fall back to the CPU", "export PYTORCH_ENABLE_MPS_FALLBACK=1"),
   ("Or run that module on the CPU", 'out = module.to("cpu")(x.cpu()).to("mps")'),
   ("Or update macOS and torch (newer MPS kernels take these cases)", "pip install -U torch torchvision torchaudio"))

# an MPS kernel that takes floating types only before a macOS release (torch's words: "isin_Tensor_Tensor_out only
# works on floating types on MPS for pre MacOS_14_0. Received dtype: Long")
_sig("unsupported.mps_macos", _UD, "An MPS kernel takes floating types only on this macOS",
     ("on mps for pre macos_",),
     "An op[ ({op})] on MPS takes floating-point tensors only before macOS[ {ver}], and got[ a tensor of {dtype}].",
     (("ud.mps_macos", 3.0),),
     r"(?P<op>\w{1,60}) only works on floating types on MPS", r"pre MacOS_(?P<ver>\d{1,2})_\d",
     r"Received dtype: (?P<dtype>\w{1,20})", confidence=0.9,
     alternatives=((_BO, 0.3, "the op has no MPS kernel for this dtype on this macOS"),))
_c("ud.mps_macos",
   "The Mac runs a macOS older than the release whose MPS kernel takes integer tensors; the op (torch.isin in a "
   "text model's token filtering, a comparison of token ids) got int64 ids.", "torchdoctor env",
   ("Update macOS (14 or later for isin on integer tensors)", "sw_vers  # shows the macOS version"),
   ("Or run that op on the CPU", "mask = torch.isin(ids.cpu(), targets.cpu()).to(ids.device)"))

# ROCm's wording of "no kernel image is available": the HIP build has no code object for the GPU's gfx target
_sig("no_accel.hip_arch", _NA, "This ROCm PyTorch has no kernels for this AMD GPU",
     ("hip error: invalid device function", "hiperrorinvaliddevicefunction",
      # hipErrorNoBinaryForGpu, the HIP runtime's wording when it loads no code object for the GPU at all (the
      # identifier itself has no lower-case key character: its sentences are the anchors)
      "unable to find code object for all current devices", "find binary for current devices"),
     "The AMD GPU is there, but the installed ROCm torch (or an extension built for it) has no kernels for its "
     "gfx target.",
     (("na.rocm_arch", 3.0), ("na.arch_not_in_build", 1.0)), confidence=0.85,
     alternatives=((_BO, 0.3, "a compiled extension (flash-attention, a custom op) was built for other targets"),))
_sig("no_accel.cuda_device_function", _NA, "This PyTorch (or an extension) has no kernel for this GPU",
     ("cuda error: invalid device function", "cudaerrorinvaliddevicefunction"),
     "The GPU is there, but a kernel launched for it has no build for its architecture.",
     (("na.arch_not_in_build", 3.0),), confidence=0.85,
     alternatives=((_BO, 0.4, "a compiled extension was built for another GPU architecture or CUDA"),))
_c("na.rocm_arch",
   "The ROCm torch was built without this GPU's gfx target: a new or integrated GPU (gfx1151 Strix Halo, "
   "gfx1150), an older card a release dropped (gfx906, gfx803), or a consumer card outside the build's list.",
   "torchdoctor env --probe",
   ("Compare the GPU's gfx target with the targets of the build",
    'python -c "import torch; print(torch.cuda.get_device_properties(0).gcnArchName, torch.cuda.get_arch_list())"'),
   ("For a card close to a supported target, have ROCm use that target's kernels (RDNA2: 10.3.0, RDNA3: 11.0.0)",
    "export HSA_OVERRIDE_GFX_VERSION=10.3.0"),
   ("Or install a torch built for this gfx target (a newer ROCm wheel, AMD's builds for the newest GPUs)",
    "pip install --pre torch torchvision torchaudio --index-url https://download.pytorch.org/whl/nightly/rocm6.4"))
# a HIP error names ROCm on Linux: the Windows DirectML reading of "AMD" / "Radeon" (rules.directml) is not it
register_rule(ContextRule("platform.hip_error", words=("hip error", "amd_serialize_kernel", "torch_use_hip_dsa"),
                          applies_to=(_NA,), boosts=(("na.rocm_arch", 6.0), ("na.directml", -9.0))))

# transformers' words: a warning ("This is an anti-pattern and will raise an Error in version v4.53"), then an error
_sig("mixed.meta_context_load", _MIX, "from_pretrained ran inside a meta device context",
     ("with a meta device context manager",),
     "from_pretrained was called while a meta device context was active (a `with torch.device(\"meta\")` block, "
     "accelerate's init_empty_weights, or torch.set_default_device('meta')); the weights it loads would stay "
     "meta placeholders, so transformers warns (4.5x) or refuses.",
     (("md.meta_context_load", 3.0), ("md.meta_to", 0.5)), confidence=0.9)
_c("md.meta_context_load",
   "A model is built under a meta device context and calls from_pretrained inside it: a model whose __init__ loads "
   "a sub-model (an encoder, a codec) with AutoModel.from_pretrained, which transformers 5 builds on meta itself, "
   "or a trainer that wraps the loading in init_empty_weights.", "torchdoctor env",
   ("Build from the config under meta and load the weights afterwards (not from_pretrained inside the context)",
    'with torch.device("meta"):\n    model = ModelClass(config)\nmodel.load_state_dict(state_dict, assign=True)'),
   ("For a library whose model loads another one in __init__, keep transformers below 5 until it is updated",
    'pip install "transformers<5"'))

# .to() on a bitsandbytes model: transformers and diffusers allow it from given bitsandbytes / accelerate versions
_sig("quant.bnb_to_version", _Q, "Moving a bitsandbytes model needs newer libraries",
     ("quantized models with the installed version of bitsandbytes", "on a pipeline that has models quantized with",
      "is not supported for 4-bit quantized models", "is not supported for 8-bit quantized models"),
     "`.to()` was called on a model (or a pipeline holding one) quantized with bitsandbytes, and the installed "
     "bitsandbytes or accelerate is too old to allow the move.",
     (("q.bnb_old", 3.0), ("q.bnb_to", 1.5)), confidence=0.9,
     alternatives=((_MIX, 0.3, "the model is dispatched over devices and the move is not needed"),))
_c("q.bnb_old",
   "transformers allows .to() on a 4-bit model from bitsandbytes 0.43.2 and diffusers on a pipeline from a recent "
   "accelerate; the installed ones are older (or a platform's own build of bitsandbytes reports an old version).",
   "torchdoctor env",
   ("Upgrade the libraries that allow the move", "pip install -U bitsandbytes accelerate"),
   ("Or drop the .to() and place the model when loading",
    'model = AutoModelForCausalLM.from_pretrained(name, quantization_config=cfg, device_map={"": "cuda:0"})'))

# an op's own check of two named operands (masked_fill, where, index_put): "expected self and mask to be on the
# same device, but got mask on cpu and self on cuda:0"
_sig("device.named_pair", _DEV, "Two operands of one op are on two devices",
     (" to be on the same device, but got ", " to be on the same device, but condition is on"),
     "An operation's operands[ '{x}' and '{y}'] are on two devices[, {a} and {b}].",
     (("dev.created_inside", 2.0), ("dev.inputs_not_moved", 1.5), ("dev.module_not_moved", 1.0)),
     rf"expected (?P<x>\w{{1,20}}) and (?P<y>\w{{1,20}}) to be on the same device, but got \w{{1,20}} on "
     rf"(?P<a>{DEV}) and \w{{1,20}} on (?P<b>{DEV})",
     # torch.where: "Expected condition, x and y to be on the same device, but condition is on cuda:0 and x and y are on
     # cuda:0 and CPU respectively"
     rf"expected condition, x and y to be on the same device, but condition is on (?P<a>{DEV}) and x and y are on "
     rf"{DEV} and (?P<b>{DEV})", require_pattern=True, confidence=0.9)
