"""Signatures and causes for families the twenty-first collection's first run (session 31, issue 41 point 7) found
nothing for: Torch-TensorRT without a converter for an op ("Conversion of function ... not currently supported") or
refusing an input dtype ("Provided an unsupported data type as an input data type"), DGL assigning a feature to a
graph on another device ("Cannot assign node feature "h" on device cuda:0 to a graph on device cpu"), torch-directml's
``PrivateUse1`` device assert, a CUDA kernel handed CPU tensors ("CUDAGuardImpl initialized with non-CUDA DeviceType:
cpu", AOTInductor's multi-device graphs), torch's XPU build failing to open the Intel GPU ("Failed to initialize XPU
devices"), vLLM's fp8_e5m2 KV cache beside an fp8 checkpoint; and, weak, where the message is missing: a dtype
mismatch said in words, an input said to be in one dtype and the weights in another, xformers said to take one
dtype only, numpy said to fail on tensors not on the CPU, a GPU architecture (sm_120) said to error, and
``from_pretrained`` called under ``with torch.device("meta")``.

Every anchor has a key (``prefilter.key_of``). The ``partial.`` and ``frames.`` signatures are weak
(``sigs_frames.WEAK_PREFIXES``): they speak only where no message does.
"""

from __future__ import annotations

from torchdoctor._explain import causes_device, causes_dtype, sigs_platform, sigs_sixteen  # noqa: F401  (causes reused)
from torchdoctor._explain.causes import define_cause as _c
from torchdoctor._explain.signatures import DEV, define as _sig

__all__: list[str] = []

_DEV, _DT, _NA, _BO, _UD = ("device_mismatch", "dtype_mismatch", "no_accelerator", "backend_op_missing",
                            "unsupported_dtype_on_device")
_MIX = "mixed_device_model"

# --- Torch-TensorRT ---------------------------------------------------------------------------------------------------
# torch_tensorrt/dynamo/conversion/_TRTInterpreter.py: "Conversion of function {target} not currently supported!"
_sig("backend.trt_no_converter", _BO, "Torch-TensorRT has no converter for an op",
     ("UnsupportedOperatorException", "conversion of function"),
     "Torch-TensorRT has no converter for[ {op}] in this version, so the graph cannot be built into one TensorRT "
     "engine with that op inside it.",
     (("bo.trt_no_converter", 3.0),), r"Conversion of function (?P<op>[\w.:]{1,120}) not currently supported",
     confidence=0.85)
_c("bo.trt_no_converter",
   "The installed Torch-TensorRT cannot convert[ {op}] (often a dtype cast such as aten._to_copy to uint8, or a "
   "new op): run that op in PyTorch (partial compilation), move it out of the compiled module, or export through "
   "ONNX, whose TensorRT parser may have it.", "torchdoctor env",
   ("Leave the op to PyTorch (partial compilation)",
    'trt_model = torch_tensorrt.compile(model, ir="dynamo", inputs=inputs, require_full_compilation=False,\n'
    '                                   torch_executed_ops={"torch.ops.aten._to_copy.default"})'),
   ("Or do the cast after the compiled module", "out = trt_model(x).mul(255).to(torch.uint8)"),
   ("Or upgrade Torch-TensorRT (converters are added each release)", "pip install -U torch-tensorrt"))
# torch_tensorrt/_enums.py: "Provided an unsupported data type as an input data type (support: bool, int32, long,
# half, float), got: {t}"
_sig("unsupported.trt_input_dtype", _UD, "Torch-TensorRT refuses a dtype",
     ("provided an unsupported data type as an input data type", "provided an unsupported data type as a data type"),
     "This Torch-TensorRT does not take[ {dtype}] (it takes[ {have}]): the input's or a precision's dtype is not one "
     "its TensorRT supports.",
     (("ud.trt_dtype", 3.0),), r"\(support: (?P<have>[\w, ]{1,80})\)", r"got: (?P<dtype>[\w.]{1,40})",
     confidence=0.85)
_c("ud.trt_dtype",
   "Torch-TensorRT maps only some torch dtypes to TensorRT: float8 (and bfloat16 on older releases) came with "
   "later Torch-TensorRT / TensorRT versions, and float64 never reaches an engine. Upgrade, or leave that dtype out "
   "of enabled_precisions and give the inputs a dtype it lists.", "torchdoctor env",
   ("Upgrade Torch-TensorRT (float8 needs 2.4+ with TensorRT 10)", "pip install -U torch-tensorrt tensorrt"),
   ("Or compile with the precisions this version has",
    "trt_model = torch_tensorrt.dynamo.compile(exp_program, inputs=[x.half()], enabled_precisions={torch.half})"))

# --- DGL: a feature on another device than its graph ---------------------------------------------------------------
# dgl/frame.py: 'Cannot assign node feature "{name}" on device {a} to a graph on device {b}. Call DGLGraph.to() to
# copy the graph to the same device.'
_sig("device.dgl_feature", _DEV, "A feature was assigned to a DGL graph on another device",
     ("cannot assign node feature", "cannot assign edge feature"),
     "A[ {what}] feature[ '{feat}'] on {a} was assigned to a DGL graph on {b}: DGL keeps a graph's features on the "
     "graph's device.",
     (("dev.dgl_graph", 3.0), ("dev.inputs_not_moved", 1.0)),
     rf"Cannot assign (?P<what>node|edge) feature [\"']?(?P<feat>\w{{1,40}})[\"']? on device (?P<a>{DEV}) to a "
     rf"graph on device (?P<b>{DEV})", confidence=0.9)
_c("dev.dgl_graph",
   "The graph was built (or loaded, batched) on one device and the features on another: dgl.graph and dgl.batch "
   "make graphs on the CPU, and graph.to(device) returns a new graph rather than moving the old one.",
   "torchdoctor.scan(model)",
   ("Move the graph to the features' device (keep the returned graph)", "g = g.to(feat.device)"),
   ("Or move the features to the graph's device", 'g.ndata["h"] = feat.to(g.device)'))

# --- torch-directml's device assert ----------------------------------------------------------------------------------
# torch-directml: "tensor.device().type() == at::DeviceType::PrivateUse1 INTERNAL ASSERT FAILED at ..." (an op on the
# DirectML device got a tensor of another device; the older plugin says "unbox expects Dml at::Tensor")
_sig("device.directml_assert", _DEV, "A DirectML op got a tensor that is not on the DirectML device",
     ("PrivateUse1",),  # as written: the camelCase identifier is the only case-stable key of the assert
     "An op on the DirectML device (PrivateUse1) got a tensor of another device: DirectML asserts that every tensor "
     "of an op is its own.",
     (("dev.directml_not_moved", 3.0), ("dev.created_inside", 1.0)),
     # the same assert followed by "unbox expects Dml at::Tensor" is sigs_sixteen's device.directml_unbox
     r"DeviceType::PrivateUse1 INTERNAL ASSERT FAILED(?![^\n]{0,300}unbox expects)", require_pattern=True,
     confidence=0.8)

# --- a CUDA kernel handed CPU tensors ---------------------------------------------------------------------------------
# c10/cuda/impl/CUDAGuardImpl.h: "CUDAGuardImpl initialized with non-CUDA DeviceType: cpu" (HIP builds print the same
# check); a CUDA kernel ran on tensors of another device: AOTInductor / inductor emitting the CUDA kernel for an op of a
# multi-device graph, or an extension's CUDA op called with CPU tensors
_sig("device.cuda_guard", _DEV, "A CUDA kernel was handed tensors of another device",
     ("initialized with non-cuda devicetype",),
     "A CUDA kernel's device guard got[ a {a}] tensor: an op ran its CUDA implementation on tensors that are not on "
     "the GPU.",
     (("dev.cuda_kernel_other_device", 3.0), ("dev.inputs_not_moved", 1.0)),
     r"initialized with non-CUDA DeviceType: (?P<a>\w{1,20})", confidence=0.8)
_c("dev.cuda_kernel_other_device",
   "The CUDA implementation of an op ran with tensors on[ {a}]: a compiled graph (AOTInductor, torch.compile) that "
   "mixes CPU and CUDA tensors got a CUDA kernel for its CPU part, or a custom / extension op that exists only for "
   "CUDA was called with CPU tensors.", "torchdoctor.scan(model)",
   ("Keep the compiled model's buffers and inputs on one device", 'model = model.to("cuda")\nx = x.to("cuda")'),
   ("Or run the CPU part outside the compiled graph", "idx = idx.cpu()  # before the compiled call, then .to(\"cuda\")"))

# --- torch's XPU build could not open the Intel GPU ----------------------------------------------------------------
# c10/xpu/XPUFunctions.cpp: "Failed to initialize XPU devices. The driver may not be installed, installed incorrectly,
# or incompatible with the current setup."
_sig("no_accel.xpu_init", _NA, "torch's XPU build could not initialise the Intel GPU",
     ("failed to initialize xpu devices",),
     "torch's XPU backend found no Intel GPU it could open: the GPU driver is missing, too old for this torch's "
     "oneAPI runtime, or this user cannot open the device.",
     (("na.xpu_driver", 4.0), ("na.intel_no_device", 1.0)), confidence=0.85)
_c("na.xpu_driver",
   "Each torch XPU release ships a oneAPI runtime that needs a recent enough Intel GPU driver (torch 2.6+xpu needs a "
   "newer one than 2.5): an older driver, a missing level-zero / intel-opencl-icd package, or a user outside the "
   "'render' group leaves torch.xpu.is_available() False.", "torchdoctor env",
   ("Install or update the Intel GPU driver, then list the devices",
    "sycl-ls  # must list a level_zero:gpu; driver: https://dgpu-docs.intel.com/driver/installation.html"),
   ("Let this user open the GPU (Linux)", "sudo usermod -aG render $USER  # then log in again"),
   ("Or stay on the torch release that works with this driver",
    "pip install torch==2.5.1 --index-url https://download.pytorch.org/whl/xpu"))

# --- vLLM: an fp8_e5m2 KV cache with an fp8 checkpoint ----------------------------------------------------------------
# vllm: "fp8_e5m2 kv-cache is not supported with fp8 checkpoints."
_sig("dtype.vllm_kv_fp8", _DT, "A KV cache dtype that does not fit the fp8 checkpoint",
     ("kv-cache is not supported with fp8 checkpoints",),
     "The KV cache dtype[ {kv}] does not fit an fp8 checkpoint, whose scales are for float8_e4m3.",
     (("dt.kv_cache_fp8", 3.0),), r"(?P<kv>fp8(?:_e[45]m[23])?) kv-cache is not supported with fp8 checkpoints",
     confidence=0.85)
_c("dt.kv_cache_fp8",
   "An fp8 checkpoint carries float8_e4m3 KV scales; vLLM takes an fp8_e4m3 (or the model's own) KV cache with it, "
   "not fp8_e5m2.", "torchdoctor env",
   ("Use the e4m3 KV cache (or leave it to the checkpoint)", "vllm serve <model> --kv-cache-dtype fp8_e4m3  # or auto"))

# --- words where the message is missing (weak) ----------------------------------------------------------------------
_DTW = r"(?:float32|float16|bfloat16|float64|fp32|fp16|bf16|half|float|double)"
_sig("partial.dtype_mismatch_words", _DT, "A dtype mismatch said in words",
     ("dtype mismatch",),
     "The text says two tensors (or a model and its input) have different dtypes, without PyTorch's own message.",
     (("dt.operand_cast", 2.0), ("dt.input_not_cast", 1.5)),
     # "Dtype mismatch (Float vs BFloat16)" names its dtypes: sigs_twelve's partial.dtype_vs reads it
     r"(?<!\bno )(?<!\bnot a )(?<!\bwithout a )\bdtype mismatch\b(?! ?\(\w{1,20} vs)", require_pattern=True,
     confidence=0.45)
_sig("partial.input_weight_dtype_words", _DT, "An input and the weights said to be in different dtypes",
     ("input is ", "input was ", "inputs are "),
     "The text says the input is in[ {a}] while the model's weights are in[ {b}], without PyTorch's own message.",
     (("dt.input_not_cast", 3.0),),
     rf"\binputs? (?:is|was|are) (?:in )?(?P<a>{_DTW})\b[^.\n]{{0,30}}?\b(?:weights?|model|parameters)\b[^.\n]{{0,20}}?"
     rf"\b(?:is|are|in) (?:in )?(?P<b>{_DTW})\b", require_pattern=True, confidence=0.45)
_sig("partial.xformers_dtype_words", _BO, "xformers said to take one dtype only (said in words)",
     ("only support", "does not support", "doesn't support", "memeffattention"),
     "The text says xformers' attention does not take this dtype, without xformers' own 'No operator found' "
     "message.",
     (("bo.xformers_no_kernel", 3.0), ("bo.xformers_build", 1.5)),
     rf"\bxformers\b[^\n]{{0,60}}?\b(?:only supports?|supports? only|doesn't support|does not support|not support"
     rf"\w{{0,2}})\b[^.\n]{{0,20}}?\b{_DTW}\b", require_pattern=True, confidence=0.45)
_sig("partial.numpy_not_cpu_words", _DEV, "numpy said to fail on tensors not on the CPU (said in words)",
     ("not on cpu", "not on the cpu"),
     "The text says converting a tensor to numpy fails when it is not on the CPU, without PyTorch's own message.",
     (("dev.numpy_on_gpu", 3.0),),
     r"(?:numpy|np\.(?:array|asarray))[^.\n]{0,60}?(?:not on (?:the )?cpu|non-cpu)",
     r"(?:not on (?:the )?cpu|non-cpu)[^.\n]{0,40}?(?:numpy|np\.(?:array|asarray))", require_pattern=True,
     confidence=0.45)
_sig("partial.sm_arch_words", _NA, "A GPU architecture said to fail or be unsupported (said in words)",
     ("blackwell",),
     "The text says the GPU's architecture[ (sm_{sm})] errors or is not supported, without torch's own warning: "
     "the installed build has no kernels for it.",
     (("na.arch_not_in_build", 3.0),),
     r"\bblackwell\b[^.\n]{0,30}?\bsm_?(?P<sm>\d{2,3})a?\b[^.\n]{0,30}?\b(?:error|not (?:yet )?supported|unsupported|"
     r"not compatible|incompatible|isn't supported)\b", require_pattern=True, confidence=0.45)
_sig("frames.meta_context_load", _MIX, "From the code: from_pretrained under a meta device context",
     ("from_pretrained(",),
     "The code calls from_pretrained inside `with torch.device(\"meta\")`: the weights it loads stay meta "
     "placeholders, and the error that follows comes from that.",
     (("md.meta_context_load", 3.0),),
     r"with torch\.device\([\"']meta[\"']\):[\s\S]{0,300}?\.from_pretrained\(", require_pattern=True,
     confidence=0.45)

# --- pin_memory of a tensor already on an accelerator (session 31's hunt: a40) ------------------------------------
# aten/src/ATen/native/Memory.cpp, _pin_memory: "cannot pin '" << self.toString() << "' only dense CPU tensors can be
# pinned" (toString: the dispatch key and scalar type, ``CUDAFloatType``; torch 1.x wrote ``torch.cuda.FloatTensor``)
_sig("device.pin_not_cpu", _DEV, "pin_memory() was called on a tensor that is not on the CPU",
     ("only dense cpu tensors can be pinned",),
     "pin_memory() pins host memory, and the tensor[ ({what})] is already on an accelerator (or sparse): only a dense "
     "CPU tensor can be pinned.",
     (("dev.pin_not_cpu", 3.0),), r"cannot pin '(?P<what>[\w.]{1,60})'", confidence=0.9)
_c("dev.pin_not_cpu",
   "A tensor already on the GPU was pinned: pinning is for a CPU tensor about to be copied to the device (or a "
   "DataLoader's pin_memory=True met a batch its collate_fn or dataset already moved to the GPU). Pin before the "
   "move, or drop pin_memory for what is already on the device.", "torchdoctor run app.py --device cuda:0",
   ("Pin the CPU tensor, then copy it", "x = x.pin_memory().to(device, non_blocking=True)"),
   ("Or skip pinning for a tensor already on the device", "staged = out if out.device.type != 'cpu' else out.pin_memory()"),
   ("Or keep the dataset and collate_fn on the CPU when the DataLoader pins",
    "loader = DataLoader(ds, batch_size=8, pin_memory=True)  # collate_fn returns CPU tensors"))
