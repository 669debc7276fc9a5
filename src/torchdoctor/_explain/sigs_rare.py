"""Signatures, causes and rules for rarer placement texts, each seen in public reports: a CPU tensor handed to an
NCCL collective, an MPS graph op's own dtype check, a Triton kernel given a CPU tensor, a tensor without storage
reaching a kernel, Adam's step counters moved to the GPU, the ``expected dtype X but got dtype Y`` and
``Query/Key/Value`` wordings, xformers' ``cutlassF`` without a kernel for the GPU, autocast switched off (for a
missing CUDA, or a dtype the device's autocast lacks: the block then runs in float32 without an error); and a dtype
an op never takes (an integer tensor in ``lerp``, a float mask in ``bitwise_and``), which is not a precision or
device question.
"""

from __future__ import annotations

from torchdoctor._explain.causes import ContextRule, register_rule
from torchdoctor._explain.causes import define_cause as _c
from torchdoctor._explain.signatures import define as _sig

__all__: list[str] = []

_DEV, _DT, _UD = "device_mismatch", "dtype_mismatch", "unsupported_dtype_on_device"
_MIX, _NA, _BO = "mixed_device_model", "no_accelerator", "backend_op_missing"

_sig("device.collective_cpu", _DEV, "A collective got a tensor on a device its process group has no backend for",
     ("no backend type associated with device type",),
     "A torch.distributed collective got a tensor on {b}, a device no backend of the process group serves (NCCL "
     "serves CUDA tensors only).",
     (("dev.collective_cpu", 3.0),),
     r"no backend type associated with device type (?P<b>\w{1,12})", confidence=0.85,
     alternatives=((_NA, 0.3, "the process group was made for a device this rank does not use"),))
_c("dev.collective_cpu",
   "A tensor on the CPU (a loss or a metric, gradients or optimizer state offloaded to the CPU, a norm computed "
   "there) was handed to a collective (all_reduce, broadcast, a gradient clip across ranks) of a process group "
   "whose only backend is NCCL.", "torchdoctor env",
   ("Move the tensor to this rank's GPU before the collective (and back after it, if it lives on the CPU)",
    "t = t.to(torch.device(\"cuda\", torch.cuda.current_device()))\ndist.all_reduce(t)"),
   ("Or give the process group a backend for CPU tensors too",
    'dist.init_process_group(backend="cpu:gloo,cuda:nccl")'))

# MPS builds each op as an MLIR graph op ('mps.divide'); other MLIR-based backends word their check alike
_sig("dtype.mps_graph_same_type", _DT, "A graph op got operands of two dtypes",
     ("op requires the same element type for all operands and results",),
     "The graph op[ {op}] got operands of different dtypes (a float16 input and float32 weights, or the other way "
     "round); MPS (and other MLIR-based backends) check this when they build the op's graph.",
     (("dt.input_not_cast", 2.0), ("dt.operand_cast", 1.5)),
     r"'(?P<op>[\w.]{1,40})' op requires the same element type", confidence=0.85)

_sig("mixed.no_storage", _MIX, "A tensor without storage reached a kernel",
     ("data pointer of tensor that doesn't have storage", "data pointer of tensor that does not have storage"),
     "A kernel read the data of a tensor that has none: a meta tensor (weights never loaded, or offloaded and not "
     "brought back), a FakeTensor, or a wrapper tensor, reached code that needs real memory.",
     (("md.offload_meta", 2.0), ("md.meta_to", 1.0)), confidence=0.8,
     alternatives=((_DEV, 0.4, "the tensor's real copy is on another device"),))

_sig("device.triton_cpu_pointer", _DEV, "A Triton kernel got a CPU tensor",
     ("cannot be accessed from triton (cpu tensor?)",),
     "A Triton kernel (compiled by torch.compile or shipped by a library) got a CPU tensor[ as its argument {index}]; "
     "Triton kernels run on the GPU and read GPU memory only.",
     (("dev.triton_cpu_arg", 3.0), ("dev.module_not_moved", 1.0)),
     r"pointer argument \(at (?P<index>\d{1,3})\) cannot be accessed from triton", confidence=0.85)
_c("dev.triton_cpu_arg",
   "A tensor the compiled code reads stayed on the CPU while the rest ran on the GPU: a plain attribute or a "
   "constant that .to() does not move, a CPU scalar tensor made inside the function, or an input not moved.",
   'torchdoctor.scan(model, device="cuda")',
   ("Make or move that tensor on the GPU (register it as a buffer so that .to() moves it)",
    "t = t.to(x.device)  # or torch.tensor(value, device=x.device)"),
   ("Check every tensor of the model before compiling", 'torchdoctor.scan(model, device="cuda")'))

_sig("device.optim_state_steps", _DEV, "An optimizer found its step counters on the GPU",
     ("state_steps should not be cuda tensors",),
     "An optimizer (Adam / AdamW) with capturable=False found its 'step' counters on the GPU; it keeps them on the "
     "CPU unless it is capturable.",
     (("dev.optim_state_steps", 3.0),), confidence=0.9)
_c("dev.optim_state_steps",
   "The optimizer's state was moved to the GPU whole, 'step' counters included: a checkpoint read with "
   "map_location=\"cuda\" and then changed by hand, or a helper that moves every tensor of the state "
   "(optimizer_to(device), a loop over state.values()).", "torchdoctor env",
   ("Load the checkpoint on the CPU and let load_state_dict place the state (it keeps 'step' on the CPU)",
    'optimizer.load_state_dict(torch.load(path, map_location="cpu")["optimizer"])'),
   ("Or move only the step counters back",
    "for s in optimizer.state.values():\n    if \"step\" in s and torch.is_tensor(s[\"step\"]):\n"
    "        s[\"step\"] = s[\"step\"].cpu()"),
   ("Or make the optimizer capturable (its steps then live on the GPU)",
    "optimizer = torch.optim.AdamW(params, lr=lr, capturable=True)"))

_sig("dtype.expected_got", _DT, "An operation expected another dtype",
     ("but got dtype ",),
     "An operation expected {b} but got {a}.",
     (("dt.input_not_cast", 2.0), ("dt.operand_cast", 1.5)),
     r"expected dtype (?P<b>\w{1,20}) but got dtype (?P<a>\w{1,20})", require_pattern=True, confidence=0.85)

_sig("dtype.qkv_either", _DT, "Attention got query, key and value in different dtypes",
     ("query/key/value should either all have the same dtype",),
     "An attention call got query, key and value in different dtypes: one of them (often the key/value from a "
     "text encoder or an adapter) was not cast to the model's dtype.",
     (("dt.input_not_cast", 2.0), ("dt.operand_cast", 1.5)), confidence=0.85)

_sig("unsupported.cutlass_no_kernel", _UD, "Memory-efficient attention has no kernel for these inputs here",
     ("cutlassf: no kernel found to launch",),
     "The memory-efficient attention kernel (cutlassF, in xformers and PyTorch's sdpa) has no build for these "
     "inputs on this GPU: bfloat16 on a GPU older than Ampere (GTX 10xx / 16xx, RTX 20xx, T4), or a dtype or "
     "head size it was not built for.",
     (("ud.cutlass_dtype", 3.0),), confidence=0.8,
     alternatives=((_BO, 0.5, "this xformers build has no kernel for this GPU at all"),))
_c("ud.cutlass_dtype",
   "The model runs in bfloat16 (or another dtype the attention kernel lacks on this GPU); GPUs before Ampere "
   "have no bfloat16 attention kernel.", "torchdoctor env",
   ("Run the model in float16 on a GPU without bfloat16", "model = model.to(torch.float16)"),
   ("Or leave the memory-efficient kernel out (PyTorch picks another one)",
    "torch.backends.cuda.enable_mem_efficient_sdp(False)"),
   ("Check what this GPU supports", "torchdoctor env"))

# a dtype the op never takes (the flags come from the kernel's name and the dtype the message gives: ``context``)
_c("ud.integer_operand",
   "An integer or bool tensor ({dtype}) reached {kernel}, an op that computes in floating point on every device: "
   "no dtype setting of the model is at fault, that tensor is (uint8 image data fed to a layer, an index or a "
   "count used as data).", "torchdoctor env",
   ("Give the op a floating-point tensor where the data is meant as numbers",
    "x = x.float()  # x: the {dtype} tensor that reached {kernel}"))
_c("ud.integer_lerp",
   "An integer or bool tensor ({dtype}) reached {kernel}: lerp is for floating-point tensors on every device. An "
   "EMA or weight-averaging update that lerps every entry of a state dict meets integer entries (a BatchNorm's "
   "num_batches_tracked, int64).", "torchdoctor env",
   ("Lerp the floating-point entries only and copy the others",
    "for e, v in zip(ema.state_dict().values(), model.state_dict().values()):\n"
    "    e.lerp_(v, 1 - decay) if v.dtype.is_floating_point else e.copy_(v)"))
_c("ud.float_for_integer_op",
   "A floating-point tensor ({dtype}) reached {kernel}, an op for integer or bool tensors on every device: a mask "
   "kept as 0.0 / 1.0 floats in a bitwise &, |, ^ or ~.", "torchdoctor env",
   ("Make the mask bool (or use the logical ops, which take any dtype)",
    "mask = mask.bool()  # or torch.logical_and(a, b)"))
_c("ud.float_targets",
   "A floating-point tensor ({dtype}) reached {kernel}: the class targets of nll_loss / cross_entropy are class "
   "indices, an integer tensor, on every device (float targets are class probabilities of the same shape as the "
   "input).", "torchdoctor env",
   ("Give the loss integer class indices", "target = target.long()"))
for _name, _flags, _unless in (("integer_operand", ("kernel_integer_dtype",), ("kernel_lerp",)),
                               ("integer_lerp", ("kernel_integer_dtype", "kernel_lerp"), ()),
                               ("float_for_integer_op", ("kernel_integer_op",), ("kernel_targets",)),
                               ("float_targets", ("kernel_integer_op", "kernel_targets"), ())):
    register_rule(ContextRule(f"rare.{_name}", flags=_flags, unless=_unless, applies_to=(_UD,),
                              boosts=((f"ud.{_name}", 6.0), ("ud.half_on_cpu", -9.0), ("ud.kernel_missing", -9.0),
                                      ("ud.cpu_only_build", -9.0))))

# autocast asked for a device this process has not: torch warns and runs the block in float32, without an error
_sig("no_accel.autocast_disabled", _NA, "Autocast was switched off: the device it names is not available",
     ("cuda is not available or torch_xla is imported. disabling autocast", "but cuda is not available. disabling"),
     "torch.autocast was asked for cuda, which this process does not have, so autocast is switched off: the block "
     "runs in float32 (twice the memory, no bfloat16 / float16 speed) and no error says so.",
     (("na.autocast_device", 3.0),), confidence=0.85)
_c("na.autocast_device",
   "The code names 'cuda' for autocast (torch.autocast(\"cuda\"), torch.cuda.amp.autocast) while the model runs "
   "elsewhere: an Intel XPU, a Mac's MPS, the CPU, or a torch without CUDA.", "torchdoctor env",
   ("Ask autocast for the device the model is on",
    "with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):\n    out = model(x)"),
   ("Check which devices this torch sees", "torchdoctor env"))
_sig("unsupported.autocast_dtype", _UD, "Autocast was switched off: the dtype is not one it supports there",
     ("autocast, but the target dtype is not supported",),
     "torch.autocast on[ {backend}] was asked for a dtype it does not support there, so it is switched off and the "
     "block runs in the tensors' own dtype[ ({backend} autocast supports {supported})].",
     (("ud.autocast_dtype", 3.0),),
     r"In (?P<backend>\w{1,12}) autocast, but the target dtype is not supported",
     r"autocast only supports dtypes of (?P<supported>[\w., ]{1,80}?) currently", confidence=0.85)
_c("ud.autocast_dtype",
   "The autocast dtype is not one this device's autocast has: float16 on an older CPU build, float32 (autocast "
   "only lowers precision), or a dtype written for another device.", "torchdoctor env",
   ("Give autocast a dtype the device supports (bfloat16 on the CPU and on an XPU)",
    "with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):\n    out = model(x)"),
   ("Pick the dtype from the device", "torchdoctor.recommend_dtype(x.device)"))

# a CUDA-only stream API on a torch without CUDA (an Intel GPU's xpu build, a Mac, a CPU build): torch's own words
# (torch/cuda/streams.py; the dummy base classes of torch/_utils.py in older builds)
_sig("no_accel.cuda_api", _NA, "A CUDA-only API on a torch without CUDA",
     ("torch.cuda.stream requires cuda support", "tried to instantiate dummy base class"),
     "Code called a CUDA-only API (torch.cuda.Stream, Event, stream(), current_stream(), synchronize()) on a torch "
     "that has no CUDA: an Intel GPU's xpu build, a Mac's mps, or a CPU build.",
     (("na.cuda_api", 3.0),), confidence=0.85)
_c("na.cuda_api",
   "The code hard-codes torch.cuda's streams and events (a layer streamer, a prefetcher) where the device is an "
   "xpu, mps or the CPU; torch (2.6 and later) has the same API for every device.", "torchdoctor env",
   ("Use the device-generic streams and events (torch.Stream, torch.Event, torch.accelerator)",
    "stream = torch.Stream(device=device)  # was torch.cuda.Stream()\nevent = torch.Event(device=device)  # was "
    "torch.cuda.Event()\nwith stream:  # was torch.cuda.stream(stream)\n    ...\n"
    "torch.accelerator.current_stream().wait_event(event)\ntorch.accelerator.synchronize()"),
   ("Check which devices this torch sees", "torchdoctor env"))

# a torch.Generator asked for on a device this torch makes none for: a Mac's torch before MPS generators
# ("Device type MPS is not supported for torch.Generator() api."), a build without that backend
# ("Cannot execute getNewGenerator() without MPS backend.", torch's own words on a CPU build)
_sig("no_accel.generator", _NA, "A random generator on a device this torch cannot make one for",
     ("is not supported for torch.generator() api", "cannot execute getnewgenerator() without"),
     "Code asked for a torch.Generator on[ {dev}], and this torch makes no generator there: an older torch on a "
     "Mac (no MPS generators yet) or a build without that backend.",
     (("na.generator", 3.0),),
     r"Device type (?P<dev>\w{1,10}) is not supported for torch\.Generator\(\) api",
     r"Cannot execute getNewGenerator\(\) without (?P<dev>\w{1,10}) backend", confidence=0.85)
_c("na.generator",
   "The seed's generator is made on the accelerator (torch.Generator(device='mps'), a pipeline's generator built "
   "from the model's device); this torch has no generator on that device, so make it on the cpu: pipelines and "
   "torch.randn draw with a cpu generator and move the result.", "torchdoctor env",
   ("Make the generator on the cpu and draw there, then move",
    "generator = torch.Generator(device='cpu').manual_seed(seed)\n"
    "noise = torch.randn(shape, generator=generator, device='cpu').to(device)"),
   ("Or a newer torch, which makes generators on MPS", "pip install -U torch"))
