"""Signatures and causes for families the sixteenth collection's first run (session 26b) found nothing for, or filed
under a neighbour: autocast asked for a device type this torch has no autocast for ("User specified an unsupported
autocast device_type 'mps'"), torch-directml's check that an op's tensors are on the DirectML device ("unbox expects
Dml at::Tensor as inputs"), NCCL's refusal of tensors that are not dense CUDA tensors, torch.embedding's older
wording of a device mismatch ("Input, output and indices must be on the current device"), the Ascend NPU's kernels
refusing a dtype ("not implemented for DT_BFLOAT16, should be in dtype support list"), a quantized model cast to
another dtype after loading, IPEX built for another torch, and an operator reached with quantized tensors or meta
placeholders (``context`` flags ``quantized_backend`` and ``meta_op``); and the words of these families where the
message is missing: the tail of torch.load's message, checkpoints "saved on CUDA" loaded on a CPU-only machine, a
dtype said to be unsupported on the NPU, a torch wheel installed "+cpu".

Every anchor has a key (``prefilter.key_of``): an anchor without one costs a search of the whole text.

The words signatures are weak (``sigs_frames.WEAK_PREFIXES``): they speak only where no message does.
"""

from __future__ import annotations

from torchdoctor._explain import causes_device, causes_dtype, causes_extra, sigs_rare  # noqa: F401  (causes reused)
from torchdoctor._explain.causes import ContextRule, register_rule
from torchdoctor._explain.causes import define_cause as _c
from torchdoctor._explain.signatures import define as _sig

__all__: list[str] = []

_DEV, _UD, _BO, _MIX = "device_mismatch", "unsupported_dtype_on_device", "backend_op_missing", "mixed_device_model"
_DS, _NA, _Q = "deserialize_device", "no_accelerator", "quantization_device"

# --- autocast for a device type this torch has none for ---------------------------------------------------------
# torch.amp.autocast_mode: "User specified an unsupported autocast device_type 'mps'" (MPS autocast came with torch
# 2.5; transformers 4.38.2's rotary embedding and accelerate's bf16 mixed precision open one on the model's device)
_sig("backend.autocast_device", _BO, "This torch has no autocast for that device type",
     ("unsupported autocast device_type",),
     "torch.autocast was opened with a device type[ ('{backend}')] this PyTorch has no autocast for.",
     (("bo.autocast_device", 3.0),),
     r"unsupported autocast device_type:? ?[\"'`]?(?P<backend>\w{1,20})", confidence=0.9,
     alternatives=((_NA, 0.2, "the code expected another accelerator than the one it runs on"),))
_c("bo.autocast_device",
   "Code (or a library: accelerate's mixed precision, a model's rotary embedding, an app's sampler) opened "
   "torch.autocast[(device_type='{backend}')], and the installed torch has no autocast for that device type (MPS "
   "autocast arrived in torch 2.5). The op itself is fine; only the autocast region is refused.", "torchdoctor env",
   ("Update torch (autocast for MPS needs 2.5 or later)", "pip install -U torch"),
   ("Or open autocast only where this torch has it",
    "import contextlib\nctx = (torch.autocast(device.type, dtype=torch.float16) if device.type == \"cuda\"\n"
    "       else contextlib.nullcontext())\nwith ctx:\n    out = model(x)"),
   ("With accelerate, turn mixed precision off on this device", "accelerate launch --mixed_precision no train.py"))

# --- torch-directml: a tensor not on the DirectML device ---------------------------------------------------------
_sig("device.directml_unbox", _DEV, "A DirectML op got a tensor that is not on the DirectML device",
     ("unbox expects dml at::tensor", "pytorch-directml-plugin"),
     "An op on the DirectML device (PrivateUse1) got a tensor that is not on it: DirectML checks that every "
     "tensor of an op is its own.",
     (("dev.directml_not_moved", 3.0), ("dev.created_inside", 1.0)), confidence=0.85)
_c("dev.directml_not_moved",
   "One tensor of the op stayed on the CPU while the rest is on the DirectML device: the input (a tensor made "
   "with torch.tensor / torch.Tensor from data), ids or masks made as LongTensor on the CPU, a module left "
   "behind (an app's --use-cpu for one part), or code that calls .cpu() in the middle of the model.",
   "torchdoctor.scan(model)",
   ("Put the model and every input on the DirectML device",
    "import torch_directml\ndml = torch_directml.device()\nmodel = model.to(dml)\nx = x.to(dml)"),
   ("Make tensors created during the forward on the device of the data they meet",
    "t = torch.zeros(shape, device=x.device)"))

# --- NCCL: tensors that are not dense CUDA tensors ----------------------------------------------------------------
_sig("device.nccl_dense", _DEV, "An NCCL collective got a tensor that is not a CUDA tensor",
     ("tensors must be cuda and dense", "expected cuda tensor but found tensor on"),
     "A torch.distributed collective on the NCCL backend got a tensor[ on {b}] that is not a dense CUDA tensor; "
     "NCCL moves CUDA tensors only.",
     (("dev.collective_cpu", 3.0),),
     r"Expected CUDA tensor but found tensor on (?P<b>\w{1,12})", confidence=0.9,
     alternatives=(("unsupported_dtype_on_device", 0.15, "a sparse tensor given to a collective raises it too"),))

# --- torch.embedding's older wording of a device mismatch --------------------------------------------------------
_sig("device.embedding_current", _DEV, "An embedding's weights and indices are on two devices",
     ("input, output and indices must be on the current device",),
     "torch.embedding got its weights and its indices on two devices (the older wording of a device mismatch).",
     (("dev.module_not_moved", 2.0), ("dev.inputs_not_moved", 1.8)), confidence=0.85,
     alternatives=(("cpu_gpu_indexing", 0.3, "the indices of a lookup sit on another device than the table"),))

# --- the Ascend NPU's kernels refusing a dtype --------------------------------------------------------------------
# torch_npu / CANN aclnn: "EZ1001: self not implemented for DT_BFLOAT16, should be in dtype support list [...]"
_sig("unsupported.npu_dtype", _UD, "An Ascend NPU kernel has no such dtype",
     ("should be in dtype support list",),
     "An Ascend NPU kernel[ ({op})] was given[ {a}] tensors, a dtype it has no implementation for.",
     (("ud.npu_dtype", 3.0),),
     r"not implemented for DT_(?P<a>\w{1,20}),?(?:\s|\\n){0,3}should be in dtype support list",  # a JSON "\n" too
     r"call (?P<op>aclnn\w{1,60}) failed", require_pattern=True, before=1500, after=400, confidence=0.9)
_c("ud.npu_dtype",
   "The NPU's kernel has no[ {a}] variant: float64 / uint64 / complex32 are missing from many aclnn ops, and "
   "bfloat16 from the Ascend 910A (the 910B has it). Model code that builds rotary tables in float64 (Flux's "
   "embeddings) or loads a bfloat16 checkpoint meets it.", "torchdoctor env",
   ("Cast to a dtype in the kernel's list before the op (float32 instead of float64)",
    "freqs = freqs.to(torch.float32)"),
   ("On a 910A, load the model in float16 instead of bfloat16",
    "model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.float16)"))

# --- a quantized model cast to another dtype after loading -------------------------------------------------------
_sig("quant.cast_dtype", _Q, "A quantized model cannot be cast to another dtype",
     ("cannot cast a quantized model", "casting a quantized model to a new", "cannot cast a bitsandbytes model",
      "cannot cast a gptq model", "can't cast a quantized model"),
     "A quantized model (bitsandbytes, GPTQ, GGUF) was cast to another dtype after loading[ ({call})]; its packed "
     "weights have a fixed dtype.",
     (("q.cast_dtype", 3.0),), r"(?P<call>\.half\(\)|\.float\(\)|\.to\(\w{0,20}\))", confidence=0.9,
     alternatives=((_MIX, 0.2, "a pipeline casting every component, quantized or not"),))
_c("q.cast_dtype",
   "Code (or an app's node) calls .to(dtype) / .half() / .float() on a model that was loaded quantized; the "
   "unquantized layers' dtype is chosen at load time instead.", "torchdoctor env",
   ("Choose the dtype when loading and do not cast afterwards",
    "model = Model.from_pretrained(name, quantization_config=cfg, torch_dtype=torch.bfloat16)"),
   ("Cast only the inputs to the model's compute dtype", "x = x.to(model.dtype)"))

# --- IPEX built for another torch -----------------------------------------------------------------------------------
_sig("backend.ipex_version", _BO, "Intel Extension for PyTorch was built for another torch",
     ("needs to work with pytorch",),
     "Intel Extension for PyTorch[ {built}] refuses to load with the installed PyTorch[ {have}]: each IPEX "
     "release is built for one torch minor version.",
     (("bo.ipex_version", 3.0),),
     r"needs to work with PyTorch\*? ?(?P<built>[\w.*]{1,20}),? but PyTorch\*? ?(?P<have>[\w.+]{1,30}) is found",
     confidence=0.95, alternatives=((_NA, 0.2, "the XPU is unusable until the pair matches"),))
_c("bo.ipex_version",
   "intel-extension-for-pytorch[ (built for {built})] and torch[ ({have})] come from different releases: a "
   "requirements file or another package upgraded or downgraded torch after IPEX was installed.",
   "torchdoctor env",
   ("Install the IPEX release made for your torch (or the torch it was made for)",
    "pip install intel-extension-for-pytorch==<the release matching torch>  # see IPEX's compatibility table"),
   ("Pin both together so other installs cannot move one of them", 'pip install "torch==2.2.*" '
    '"intel-extension-for-pytorch==2.2.*"'))

# --- an operator reached with quantized tensors (``context`` flag quantized_backend) ---------------------------------
_c("bo.quantized_tensor",
   "A tensor of an eager-mode quantized model (quint8 / qint8) reached an op without a quantized kernel, or a "
   "float tensor reached a quantized op: a QuantStub / DeQuantStub is missing around that part of the model, a "
   "skip connection adds with + instead of FloatFunctional, or the quantized model was moved to the GPU (its "
   "kernels run on the CPU).", "torchdoctor env",
   ("Quantize the input where the quantized part starts, and dequantize where it ends",
    "self.quant = torch.ao.quantization.QuantStub()\nself.dequant = torch.ao.quantization.DeQuantStub()"),
   ("Add and multiply quantized tensors through FloatFunctional",
    "self.add = torch.ao.nn.quantized.FloatFunctional()\nout = self.add.add(x, identity)"),
   ("Run an eager-quantized model on the CPU", 'model.to("cpu")'))
register_rule(ContextRule(
    "ipex_lib_symbol", flags=("ipex_lib",), applies_to=(_BO,), boosts=(("bo.ipex_version", 4.0),),
    why="the library that does not load is IPEX's: it was built for another torch"))
register_rule(ContextRule(
    "quantized_tensor_op", flags=("quantized_backend",), applies_to=(_BO, _DEV),
    boosts=(("bo.quantized_tensor", 6.0),),
    why="the op was reached with quantized tensors (or a quantized op with float ones)"))
register_rule(ContextRule(
    "meta_tensor_op", flags=("meta_op",), applies_to=(_BO,), category=_MIX, weight=2.0,
    boosts=(("md.meta_to", 3.0), ("md.offload_meta", 2.0)),
    why="an aten op ran on meta tensors: placeholders without data, a model never materialised"))

# --- words where the message is missing (weak) ----------------------------------------------------------------------
_sig("partial.load_map_location", _DS, "torch.load's advice to map storages (the rest of the message is cut)",
     ("to map your storages to",),
     "The text holds the end of torch.load's message (use map_location to map the storages): a checkpoint saved "
     "on a GPU was loaded where that GPU is not available.",
     (("ds.cpu_only_load", 3.0),), confidence=0.55)
_sig("partial.saved_on_gpu", _DS, "A checkpoint saved on a GPU loaded on a CPU-only machine (said in words)",
     ("checkpoints saved on", "checkpoint saved on", "weights saved on", "model saved on", "serialized from cuda",
      "saved from cuda"),
     "The text says checkpoints saved on a GPU are loaded where there is no GPU, without PyTorch's message.",
     (("ds.cpu_only_load", 3.0),),
     r"load\w{0,4}[^\n]{0,80}(?:saved|serialized) (?:on|from) (?:a )?(?:cuda|gpu)",
     r"(?:saved|serialized) (?:on|from) (?:a )?(?:cuda|gpu)[^\n]{0,80}(?:map_location|cpu[- ]only)",
     require_pattern=True, confidence=0.45)
_NPU_DT = r"float64|double|fp64|bfloat16|bf16|uint64|uint32|complex32|complex64|float8\w{0,8}"
_sig("partial.npu_dtype", _UD, "A dtype said to be unsupported on the NPU",
     ("not supported on npu", "not supported by npu", "not supported on the npu"),
     "The text says the NPU does not support[ {a}], without the kernel's own message.",
     (("ud.npu_dtype", 3.0),),
     rf"npu (?:does )?not supports? (?P<a>{_NPU_DT})",
     rf"(?P<a>{_NPU_DT})`?,? (?:(?:which|that) )?(?:is|are) not supported (?:on|by) (?:the )?npu",
     require_pattern=True, confidence=0.45)
_sig("partial.cpu_wheel", _NA, "A CPU-only torch wheel was installed (said in words)",
     ("+cpu has been installed", "+cpu was installed", "+cpu is installed", "+cpu got installed"),
     "The text says the installed torch is a CPU-only build[ ({have})].",
     (("na.cpu_build", 3.0),), r"(?P<have>\d{1,2}\.\d{1,2}(?:\.\d{1,2})?\+cpu)", confidence=0.45)
