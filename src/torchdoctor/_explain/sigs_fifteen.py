"""Signatures and causes for families seen in public reports that nothing recognised (the fifteenth collection's
first run, session 26): MPS kernels that refuse int64 inputs (cumsum on macOS before 13.3), the Intel GPU runtime
finding no device (a SYCL "PI_ERROR_DEVICE_NOT_FOUND"), bitsandbytes' "assert quant_state is not None" (4-bit weights
that were never quantized on a GPU), and a dtype mismatch retold as the dtype a component wants.

Every anchor has a key (``prefilter.key_of``): an anchor without one costs a search of the whole text.

The words signatures are weak (``sigs_frames.WEAK_PREFIXES``): they speak only where no message does.
"""

from __future__ import annotations

from torchdoctor._explain import causes_device, causes_dtype, causes_extra  # noqa: F401  (the causes reused below)
from torchdoctor._explain.causes import define_cause as _c
from torchdoctor._explain.signatures import define as _sig

__all__: list[str] = []

_UD, _NA, _Q, _DT = "unsupported_dtype_on_device", "no_accelerator", "quantization_device", "dtype_mismatch"
_GUARD = "with torchdoctor.guard(model):\n    model(*inputs)"

# --- MPS kernels that refuse int64 inputs -------------------------------------------------------------------------
# "RuntimeError: MPS does not support cumsum op with int64 input" (also cumprod; "Support has been added in macOS
# 13.3" in later torch): transformers' generate() runs attention_mask.long().cumsum(-1) for position ids, so every
# text model's generate on an older macOS meets it
_sig("unsupported.mps_int64_op", _UD, "An MPS kernel refuses int64 inputs on this macOS",
     ("does not support cumsum op", "does not support cumprod op", "op with int64 input", "ops with int64 input"),
     "The MPS kernel[ {op}] got an int64 tensor, which it supports only on macOS 13.3 and later (and a torch that "
     "knows it).",
     (("ud.mps_int64", 3.0),),
     r"MPS does not support (?P<op>\w{1,30}) ops? with (?P<dtype>int64) input", require_pattern=True,
     confidence=0.95, alternatives=(("backend_op_missing", 0.3, "the op has no MPS kernel for int64 at all here"),))
_c("ud.mps_int64",
   "Apple's MPS added int64 support for cumsum / cumprod in macOS 13.3; on an older macOS (or with a torch older "
   "than that support) the kernel refuses int64 tensors. transformers' generate() computes position ids with "
   "attention_mask.long().cumsum(-1), so generating text on mps meets it first. PYTORCH_ENABLE_MPS_FALLBACK does "
   "not help: the op exists, the dtype is refused.", "torchdoctor env",
   ("Update macOS to 13.3 or later and torch to a release that uses it", "pip install -U torch"),
   ("Or do that op in int32 (positions and masks fit)", "position_ids = attention_mask.int().cumsum(-1) - 1"),
   ("Or run generation on the CPU", 'model.to("cpu")'))

# --- the Intel GPU runtime finding no device ----------------------------------------------------------------------
# SYCL / Level Zero: "(PI_ERROR_DEVICE_NOT_FOUND)", "UR_RESULT_ERROR_DEVICE_NOT_FOUND", "No device of requested type
# available" (ipex-llm's ollama / llama.cpp SYCL builds, torch XPU): no Intel GPU the runtime can open
_sig("noaccel.intel_no_device", _NA, "The Intel GPU runtime found no device",
     ("pi_error_device_not_found", "ur_result_error_device_not_found", "no device of requested type available"),
     "The Intel GPU runtime (SYCL / Level Zero) found no GPU to run on: none is in the machine, its driver is not "
     "loaded, or the device selector hides it.",
     (("na.intel_no_device", 8.0),), confidence=0.85,  # above the XPU build's cause: the runtime is there
     alternatives=(("backend_op_missing", 0.2, "the runtime is there but this build targets another device"),))
_c("na.intel_no_device",
   "SYCL (oneAPI, Level Zero) could not open an Intel GPU: the machine has none (a Xeon or another CPU-only host: "
   "ipex-llm's GPU builds, the ollama / llama.cpp SYCL binaries and torch's XPU backend need one), the GPU driver "
   "(intel-opencl-icd, level-zero) is missing, or ONEAPI_DEVICE_SELECTOR / ZE_AFFINITY_MASK selects no GPU.",
   "torchdoctor env",
   ("List the devices the runtime sees", "sycl-ls"),
   ("On a machine without an Intel GPU, use the CPU build instead", "pip install ipex-llm[cpp]  # or torch's CPU "
    "build"),
   ("Do not narrow the devices by accident", "unset ONEAPI_DEVICE_SELECTOR ZE_AFFINITY_MASK"))

# --- bitsandbytes: 4-bit weights that were never quantized ---------------------------------------------------------
# "assert quant_state is not None" (bitsandbytes' matmul_4bit / Linear4bit.forward): a Params4bit quantizes when it
# is moved to a CUDA device; a model loaded with device_map cpu (or built under init_empty_weights and moved
# piecemeal) keeps plain weights and no quant_state
_sig("quant.bnb_no_quant_state", _Q, "A bitsandbytes 4-bit layer has no quantization state",
     ("assert quant_state is not none", "quant_state is not none"),
     "A bitsandbytes 4-bit layer ran without its quant_state: its weight was never quantized, which happens only "
     "when the Params4bit is moved to a CUDA device.",
     (("q.bnb_never_quantized", 3.0),), confidence=0.85,
     alternatives=(("no_accelerator", 0.3, "4-bit bitsandbytes needs a GPU this process does not use"),))
_c("q.bnb_never_quantized",
   "The 4-bit model was loaded or kept on the CPU (device_map='cpu' or {'': 'cpu'}, a CPU-only machine, modules "
   "offloaded by device_map='auto'), so bitsandbytes never quantized its weights and the layer has no quant_state "
   "to compute with. Quantization happens on the move to a CUDA GPU.", "torchdoctor env",
   ("Load the quantized model on the GPU", 'model = AutoModelForCausalLM.from_pretrained(name, '
    'quantization_config=bnb_config, device_map={"": 0})'),
   ("On a machine without a GPU, load it without quantization_config",
    'model = AutoModelForCausalLM.from_pretrained(name, device_map="cpu", torch_dtype=torch.float32)'))

# --- the words of a dtype mismatch: the dtype a component wants and the one it got (weak) --------------------------
# "this doesn't want bfloat it wants half", "the adapter wants float16 but gets bfloat16": the message is missing
_DTW = r"(?:torch\.)?(?:bfloat16|bfloat|float16|float32|float64|float|half|double|bf16|fp16|fp32)"
_sig("partial.dtype_wanted", _DT, "A component wants another dtype (said in words)",
     ("want bf", "want fp", "it wants ", "wants float", "wants half", "expects bf", "expects float",
      "expects half"),
     "The text says a component wants {b} while it is given {a}, without PyTorch's own message: two dtypes meet in "
     "one operation.",
     (("dt.input_not_cast", 2.0), ("dt.module_partially_cast", 1.5)),
     rf"(?:doesn'?t|does not|don'?t) want (?P<a>{_DTW})\b[^\n]{{0,30}}?\bwants? (?P<b>{_DTW})\b",
     rf"(?:wants?|expects?) (?P<b>{_DTW})\b[^\n]{{0,40}}?\b(?:but|instead of|not) (?:it )?(?:got |gets |is |given )?"
     rf"(?P<a>{_DTW})\b", require_pattern=True, confidence=0.45)
