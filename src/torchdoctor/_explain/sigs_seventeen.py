"""Signatures and causes for families the seventeenth collection's first run (session 26c) found nothing for: a
sparse tensor's indices and values on two devices ("device of indices (0) must match device of values (5)"), a
CUDA-only op's own check of its input (``TORCH_CHECK(x.is_cuda())``: "Expected inputs[i].is_cuda() to be true but
got false", an ``INTERNAL ASSERT`` on ``is_cuda()``, Torch-TensorRT's "Expected input tensors to have device cuda,
found device cpu"), the legacy type wordings of torch 0.4-1.x ("Expected object of type torch.LongTensor but found
type torch.FloatTensor", "expected backend CUDA and dtype Float but got backend CUDA and dtype Long"), a FakeTensor
cross-check of devices ("MetadataMismatchError: Devices cpu and cuda:0 are not equal!"), a data-parallel wrapper's
check that its parameters share a device (fairscale's bucket, DDP), a device type this torch does not know ("Expected
one of cpu, cuda, ... device type at start of device string: npu": the backend's plug-in not imported), a CPU-only
torch without its CUDA bindings (``torch._C`` has no ``_cuda_memoryStats``), NCCL refusing a dtype ("not supported
for NCCL process group: ComplexFloat"); and, weak, where the message is missing: a cast retold in words ("casts bf16
inputs to fp16"), a CUDA deserialization error named in words, a traceback cut inside torch.load's unpickling of a
storage, and one cut inside the DataLoader's sampler.

Every anchor has a key (``prefilter.key_of``). The ``frames.`` and ``partial.`` signatures are weak
(``sigs_frames.WEAK_PREFIXES``): they speak only where no message does.
"""

from __future__ import annotations

from torchdoctor._explain import causes_device, causes_dtype  # noqa: F401  (causes reused)
from torchdoctor._explain.causes import ContextRule, register_rule
from torchdoctor._explain.causes import define_cause as _c
from torchdoctor._explain.signatures import DEV
from torchdoctor._explain.signatures import define as _sig

__all__: list[str] = []

_DEV, _DT, _UD, _MIX = "device_mismatch", "dtype_mismatch", "unsupported_dtype_on_device", "mixed_device_model"
_DS, _NA = "deserialize_device", "no_accelerator"
_LEGACY = r"Long|Float|Double|Half|Int|Short|Byte|Char|Bool|BFloat16|ComplexFloat|ComplexDouble"

# --- a sparse tensor's indices and values on two devices ------------------------------------------------------------
# aten/src/ATen/SparseTensorImpl.cpp: "device of indices (0) must match device of values (5)"; before torch 1.9 also
# raised for indices and values both on cuda:N while cuda:0 was the current device (pytorch#28500, #54075)
_sig("device.sparse_parts", _DEV, "A sparse tensor's indices and values are on two devices",
     ("must match device of values",),
     "torch.sparse_coo_tensor got its indices and its values on two devices[ (indices on device {a}, values on "
     "device {b})]: a sparse tensor keeps both on one device.",
     (("dev.sparse_parts", 3.0), ("dev.created_inside", 1.0)),
     r"device of indices \((?P<a>-?\d{1,3})\) must match device of values \((?P<b>-?\d{1,3})\)",
     require_pattern=True, confidence=0.9)
_c("dev.sparse_parts",
   "The indices and the values of the sparse tensor sit on two devices: one of them was made on the CPU (a Python "
   "list, torch.tensor without device=), or both are on a GPU other than the current one, which torch before 1.9 "
   "compared against the current device.", "torchdoctor env",
   ("Make indices and values on one device", "indices = indices.to(values.device)\n"
    "s = torch.sparse_coo_tensor(indices, values, size, device=values.device)"),
   ("On torch before 1.9 with a GPU other than cuda:0, build it with that GPU current",
    "with torch.cuda.device(values.device):\n    s = torch.sparse_coo_tensor(indices, values, size)"))

# --- a CUDA-only op's own check of its input ------------------------------------------------------------------------
# TORCH_CHECK(x.is_cuda()) prints "Expected x.is_cuda() to be true, but got false"; an INTERNAL ASSERT on is_cuda()
# (sparse addmm / spmm on a CPU sparse and a CUDA dense tensor); Torch-TensorRT's runtime: "Expected input tensors to
# have device cuda, found device cpu"; extensions' CHECK_CUDA macro: "x must be a CUDA tensor"
_sig("device.is_cuda_check", _DEV, "A CUDA-only op got a tensor on another device",
     # an INTERNAL ASSERT is written in capitals, which hold no key: read from the sentence after it
     ("is_cuda() to be true", "please report a bug to pytorch", "to have device cuda, found device",
      "must be a cuda tensor"),
     "An op that checks where its inputs are[ ({what})] found a tensor on the wrong device[: {a} where {b} was "
     "expected].",
     (("dev.cuda_only_op", 3.0), ("dev.created_inside", 1.0), ("dev.inputs_not_moved", 1.0)),
     r"Expected (?P<what>!?[\w.\[\]]{1,60}\.is_cuda\(\)) to be true,? but got false",
     r"(?P<what>!?[\w.\[\]]{1,60}\.is_cuda\(\)) INTERNAL ASSERT FAILED",
     rf"to have device (?P<b>{DEV}), found device (?P<a>{DEV})",
     r"(?P<what>\w{1,40}) must be a CUDA tensor", require_pattern=True, confidence=0.85,
     alternatives=((_NA, 0.2, "a CUDA-only op run on a machine or build without CUDA"),))
_c("dev.cuda_only_op",
   "The op runs on CUDA only (a compiled extension's kernel, a TensorRT engine, a sparse CUDA kernel) or on the CPU "
   "only, and one of its tensors is on the other device: an input left on the CPU, an index or mask made inside the "
   "model without device=, or a sparse matrix that was never moved with the dense one.", "torchdoctor.scan(model)",
   ("Move every input of the op to the device it runs on", "x = x.to(\"cuda\")\nsparse = sparse.to(x.device)"),
   ("Make tensors created inside the model on the device of the data they meet",
    "idx = torch.arange(n, device=x.device)"))

# --- the legacy type wordings of torch 0.4-1.x ----------------------------------------------------------------------
# "Expected object of type torch.LongTensor but found type torch.FloatTensor for argument #2 'mat2'" (0.4): the same
# device prefix on both sides is a dtype mismatch, a "cuda." on one side only is a device mismatch
_sig("dtype.legacy_type", _DT, "An operation got a tensor of another type (older PyTorch wording)",
     ("expected object of type torch.", "expected backend "),
     "An operation got a tensor of another type than it expected[ ({a} where {b} was expected)][ (argument "
     "'{arg}')].",
     (("dt.input_not_cast", 2.0), ("dt.module_partially_cast", 1.5)),
     rf"Expected object of type torch\.(?P<pb>(?:cuda\.)?)(?P<b>{_LEGACY})Tensor but found type torch\.(?P=pb)"
     rf"(?!(?P=b)Tensor)(?P<a>{_LEGACY})Tensor(?: for argument #\d{{1,2}} '?(?P<arg>\w{{1,40}})'?)?",
     rf"expected backend (?P<x>\w{{1,12}}) and dtype (?P<b>{_LEGACY}) but got backend (?P=x) and dtype "
     rf"(?!(?P=b)\b)(?P<a>{_LEGACY})", require_pattern=True, confidence=0.85,
     alternatives=((_UD, 0.2, "an op without a kernel for that dtype on that device reads alike"),))
_sig("device.legacy_type", _DEV, "An operation got a tensor on another device (older PyTorch wording)",
     ("expected object of type torch.", "expected backend "),
     "An operation got a tensor on another device than the rest[ (expected on {b})][ (found on {a})][ (argument "
     "'{arg}')].",
     (("dev.module_not_moved", 2.0), ("dev.inputs_not_moved", 1.5)),
     rf"Expected object of type torch\.(?P<b>cuda)\.(?P<t>{_LEGACY})Tensor but found type torch\.(?P=t)Tensor"
     rf"(?: for argument #\d{{1,2}} '?(?P<arg>\w{{1,40}})'?)?",
     rf"Expected object of type torch\.(?P<t>{_LEGACY})Tensor but found type torch\.(?P<a>cuda)\.(?P=t)Tensor"
     rf"(?: for argument #\d{{1,2}} '?(?P<arg>\w{{1,40}})'?)?",
     rf"expected backend (?P<b>\w{{1,12}}) and dtype (?P<t>{_LEGACY}) but got backend (?!(?P=b)\b)(?P<a>\w{{1,12}}) "
     r"and dtype (?P=t)\b", require_pattern=True, confidence=0.85,
     alternatives=(("input_weight_type_mismatch", 0.3, "a layer whose weights were not moved with its input"),))

# --- FakeTensor's cross-check of a kernel's output device -----------------------------------------------------------
_sig("mixed.fake_metadata", _MIX, "FakeTensor tracing found a kernel's output on another device",
     # the class name is written in CamelCase, which holds no key: read from the sentence's end
     ("are not equal!",),
     "While tracing with fake tensors (torch.compile / export / Torch-TensorRT), the fake result[ of {op}] is on "
     "another device than the real one[ ({a} and {b})]: a tensor of the traced program sits on another device "
     "than the rest.",
     (("md.fake_input_cpu", 2.0), ("md.fake_tensor", 3.0)),
     rf"Devices (?P<a>{DEV}) and (?P<b>{DEV}) are not equal!?(?: \((?P<op>[\w.]{{1,80}})\))?",
     require_pattern=True, confidence=0.8, alternatives=((_DEV, 0.4, "a plain op with tensors on two devices"),))

# --- a data-parallel wrapper whose parameters sit on several devices ------------------------------------------------
# fairscale ShardedDDP's bucket: "Different devices for the bucket and the param, cannot proceed: cuda:4 - cpu"; DDP:
# "DistributedDataParallel's input module must be on the same type of devices, but input module parameters locate in
# {'cpu', 'cuda'}"
_sig("mixed.wrapper_devices", _MIX, "A data-parallel wrapper found the model's tensors on several devices",
     ("different devices for the bucket and the param", "must be on the same type of devices"),
     "A data-parallel wrapper (DDP, fairscale) found the model's parameters and buffers on several devices[ ({a} "
     "and {b})]; it needs the whole model on one device before wrapping.",
     (("md.wrapper_split", 3.0), ("dev.module_not_moved", 1.0)),
     rf"cannot proceed: (?P<a>{DEV}) - (?P<b>{DEV})", r"parameters locate in \{(?P<a>[^}]{1,60})\}", confidence=0.9,
     alternatives=((_DEV, 0.3, "one tensor of the model made on the CPU during the forward"),))
_c("md.wrapper_split",
   "Part of the model stayed on the CPU when it was wrapped: a buffer or parameter created after model.to(device), "
   "submodules kept in a plain list or dict (not nn.ModuleList / ModuleDict, so .to() does not see them), or a "
   "layer placed by hand on another device.", "torchdoctor.scan(model)",
   ("Move the whole model to the rank's device before wrapping it",
    "model = model.to(local_rank)\nmodel = DDP(model, device_ids=[local_rank])"),
   ("Register submodules so .to() moves them", "self.blocks = nn.ModuleList(blocks)  # not a plain list"))

# --- a device type this torch does not know -------------------------------------------------------------------------
# c10/core/Device.cpp: "Expected one of cpu, cuda, ipu, xpu, ... device type at start of device string: npu"
_sig("no_accel.device_string", _NA, "This torch does not know the device type",
     ("device type at start of device string",),
     "torch was asked for a device type[ ('{backend}')] that the installed torch does not know: its backend "
     "plug-in is not loaded, or the torch is too old for it.",
     (("na.device_type_unknown", 3.0),),
     r"device type at start of device string:? ?'?(?P<backend>\w{1,20})", confidence=0.9,
     alternatives=(("backend_op_missing", 0.2, "a plug-in installed for another torch fails to register"),))
_c("na.device_type_unknown",
   "The device type[ '{backend}'] comes from a plug-in that was not imported (torch_npu for 'npu', "
   "torch_directml, intel_extension_for_pytorch for 'xpu' before torch 2.4) or not installed, or the torch is "
   "older than the backend ('mps' needs 1.12).", "torchdoctor env",
   ("Import the backend's plug-in before naming its device", "import torch\nimport torch_npu  # registers 'npu'\n"
    "x = x.to(\"npu:0\")"),
   ("Or install the plug-in built for this torch", "pip install torch-npu==<the release matching torch>"))

# the message lists every device type torch knows ("cpu, cuda, ipu, xpu, ..., mps"): those words name no platform here
register_rule(ContextRule(
    "device_string_list", words=("at start of device string",), applies_to=(_NA,),
    boosts=(("na.device_type_unknown", 9.0), ("na.xpu_build", -5.0), ("na.mac", -3.0), ("na.cpu_build", -2.0)),
    why="the device type is one this torch does not know, whatever platform words its list of types holds"))

# --- a CPU-only torch without its CUDA bindings ---------------------------------------------------------------------
_sig("no_accel.torch_c_cuda", _NA, "This torch has no CUDA bindings",
     # "torch._C" holds a capital: the words form is read from the function's name ("_cuda_memoryStats")
     ("has no attribute '_cuda_", "._cuda_memory"),
     "A CUDA function of torch's C module[ ({fn})] is missing: the installed torch is a build without CUDA.",
     (("na.cpu_build", 3.0), ("na.hardcoded_cuda", 1.0)),
     r"has no attribute '(?P<fn>_cuda_\w{1,40})'", r"torch\._C\.(?P<fn>_cuda_\w{1,40}) (?:is )?missing",
     require_pattern=True, confidence=0.8)

# --- NCCL refusing a dtype ------------------------------------------------------------------------------------------
_sig("unsupported.nccl_dtype", _UD, "NCCL has no such data type",
     ("is not supported for nccl process group",),
     "A collective on the NCCL backend got[ {a}] tensors, a data type NCCL cannot reduce or send.",
     (("ud.nccl_dtype", 3.0),), r"not supported for NCCL process group:? ?(?P<a>\w{1,20})", confidence=0.9)
_c("ud.nccl_dtype",
   "NCCL moves a fixed set of types; complex tensors (before torch 2.1), bool or float8 ones are not among them.",
   "torchdoctor env",
   ("Send a complex tensor as its real view", "dist.all_reduce(torch.view_as_real(z))"),
   ("Or cast to a dtype NCCL has around the collective", "t = t.float()\ndist.all_reduce(t)"))

# --- words where the message is missing (weak) ----------------------------------------------------------------------
_F = r"bf16|bfloat16|fp16|float16|half|fp32|float32"
_sig("partial.cast_words", _DT, "A dtype cast named as the problem (said in words)",
     ("inputs to fp16", "inputs to bf16", "inputs to float16", "inputs to bfloat16", "inputs to fp32",
      "inputs to float32", "weights to fp16", "weights to bf16", "weights to fp32", "weights to float32"),
     "The text says tensors are cast to another dtype[ ({a} to {b})] where they should not be, without PyTorch's "
     "own message: two dtypes then meet in one operation.",
     (("dt.input_not_cast", 2.0), ("dt.module_partially_cast", 1.5)),
     rf"cast\w{{0,3}} (?:the )?(?P<a>{_F}) (?:inputs?|weights?) to (?P<b>{_F})", require_pattern=True,
     confidence=0.45)
_sig("partial.deserialize_words", _DS, "A CUDA deserialization error named in words",
     ("deserialization error", "deserializing error", "deserialize error"),
     "The text names an error deserializing CUDA tensors without torch.load's message: a checkpoint saved on a GPU "
     "loaded where that GPU is not available.",
     (("ds.cpu_only_load", 3.0),),
     r"(?:cuda|gpu)[^\n]{0,40}deserializ\w{0,6} error",
     r"deserializ\w{0,6} error[^\n]{0,60}(?:cpu[- ]only|cuda|gpu|map_location)", require_pattern=True,
     confidence=0.45)
_sig("frames.load_from_bytes", _DS, "From the stack: torch.load unpickling a storage (message missing)",
     (", in _load_from_bytes",),
     "The error message is missing; the stack ends in torch.load restoring a storage pickled inside another "
     "pickle (numpy, pickle.load): storages saved on a GPU that this process does not have.",
     (("ds.cpu_only_load", 3.0), ("ds.device_index", 2.0)), confidence=0.45,
     alternatives=((_NA, 0.3, "this torch sees no GPU at all: a CPU-only build or a missing driver"),))
# the sampler draws its permutation with a CPU generator; under torch.set_default_tensor_type(torch.cuda.FloatTensor)
# (or set_default_device("cuda")) randperm is asked for a CUDA tensor: the commonest failure inside the sampler
_sig("frames.sampler_generator", _DEV, "From the stack: the DataLoader's sampler failed (message missing)",
     ("._try_put_index()", ", in _try_put_index", ", in _next_index"),
     "The error message is missing; the stack ends in the DataLoader's sampler drawing the next indices: its "
     "random generator is on the CPU while the default tensor type (or default device) is CUDA.",
     (("dev.sampler_generator", 3.0), ("dev.generator_device", 1.0)), confidence=0.4)
_c("dev.sampler_generator",
   "The program sets CUDA as the default (torch.set_default_tensor_type(torch.cuda.FloatTensor), "
   "torch.set_default_device(\"cuda\")), so the sampler's torch.randperm makes a CUDA tensor while the DataLoader's "
   "generator is a CPU one (torch 1.9 and later check this).", "torchdoctor env",
   ("Give the DataLoader a generator on the default device",
    "loader = DataLoader(ds, batch_size=bs, shuffle=True, generator=torch.Generator(device=\"cuda\"))"),
   ("Or keep the CPU as the default and move tensors explicitly",
    "torch.set_default_tensor_type(torch.FloatTensor)  # instead of torch.cuda.FloatTensor\nx = x.to(\"cuda\")"))
