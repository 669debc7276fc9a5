"""Signatures of placement errors: two devices in one op, input vs weight, checkpoints, meta, quantized weights.

Data only (see ``signatures`` for the fields). Alternatives name the other categories the same words fit, with
why; the context rules (``rules``) can then promote one of them.
"""

from __future__ import annotations

from torchdoctor._explain.signatures import DEV
from torchdoctor._explain.signatures import define as _sig

__all__: list[str] = []

_Q_ALT = ("quantization_device", 0.45, "a quantized layer (bitsandbytes, GPTQ, AWQ) whose packed weights or "
          "quant_state stayed on another device raises the same message")
_MIX_ALT = ("mixed_device_model", 0.3, "a model partly offloaded or dispatched over devices (device_map, "
            "offload hooks) raises the same message")
_DEV_ALT = ("device_mismatch", 0.4, "the same message comes from a plain op whose tensors sit on two devices")

# --- device ------------------------------------------------------------------------------------------------
_sig("device.expected_same", "device_mismatch", "Tensors on two devices met in one operation",
     ("Expected all tensors to be on the same device", "found at least two devices",
      "different from other tensors on"),
     "An operation[ ({op})] got tensors on two devices, {a} and {b}[; the argument on the odd device is "
     "'{arg}']. Every tensor of one op must sit on the same device.",
     (("dev.module_not_moved", 2.0), ("dev.inputs_not_moved", 1.5), ("dev.created_inside", 0.5)),
     rf"found at least two devices,? (?P<a>{DEV})(?: and (?P<b>{DEV}))?",
     rf"but got (?P<arg>\w{{1,40}}) is on (?P<a>{DEV}),? different from other tensors on (?P<b>{DEV})",
     r"for argument (?P<arg>\w{1,40}) in method (?P<method>\w{1,80})",
     r"in method (?P<method>\w{1,80})", before=0, after=400, alternatives=(_Q_ALT, _MIX_ALT))
_sig("device.expected_device", "device_mismatch", "A tensor is not on the device the op expected",
     ("is not on the expected device",),
     "A tensor on {a} reached an operation that runs on {b}.",
     (("dev.module_not_moved", 2.0), ("dev.inputs_not_moved", 1.0), ("dev.created_inside", 1.0)),
     rf"Tensor on device (?P<a>{DEV}) is not on the expected device (?P<b>{DEV})", require_pattern=True,
     alternatives=(_MIX_ALT, _Q_ALT))
_sig("device.legacy", "device_mismatch", "Tensors on two devices met in one operation (older PyTorch wording)",
     ("Expected object of device type", "expected device", "but expected it to be on", "but expected on",
      "at the same device",
      "must be on the same device", "to have the same device as tensor", "Expected object of backend"),
     "An operation got tensors on two devices, {a} and {b}[; the argument on the odd device is '{arg}'].",
     (("dev.module_not_moved", 2.0), ("dev.inputs_not_moved", 1.5)),
     r"Expected object of (?:device type|backend) (?P<b>\w{1,10}) but got (?:device type|backend) (?P<a>\w{1,10})"
     r"(?: for argument #\d{1,2} '?(?P<arg>\w{1,40})'?)?",
     rf"expected device (?P<b>{DEV}) but got device (?P<a>{DEV})",
     r"argument #\d{1,2} '?(?P<arg>\w{1,40})'? is on (?P<a>CPU|GPU|XPU|MPS|CUDA),? but expected it to be on "
     r"(?P<b>CPU|GPU|XPU|MPS|CUDA)",
     # torch's MPS and XPU checks: "Tensor for argument input is on cpu but expected on mps"
     rf"Tensor for argument #?\d{{0,2}} ?'?(?P<arg>\w{{1,40}})'? is on (?P<a>{DEV}),? but expected on (?P<b>{DEV})",
     rf"All input tensors must be on the same device\. Received (?P<a>{DEV}) and (?P<b>{DEV})",
     rf"found input tensor at (?P<a>{DEV}) and hidden tensor at (?P<b>{DEV})",
     r"tensor for argument #\d{1,2} '?(?P<arg>\w{1,40})'? to have the same device as tensor",
     rf"must be on the same device but got self on (?P<a>{DEV}) and window on (?P<b>{DEV})",
     require_pattern=True, alternatives=(_Q_ALT,))
# "slow_conv2d_forward_mps: input(device='cpu') and weight(device=mps:0') must be on the same device": a layer whose
# input and weights sit apart; which side is behind decides the first cause (derive's input_behind / weights_behind)
_sig("device.conv_input", "device_mismatch", "A layer got its input and its weights on two devices",
     ("must be on the same device",),
     "A layer's kernel ({op}) got its input on {a} and its {param} on {b}. The input must sit where the layer's "
     "weights are.",
     (("dev.inputs_not_moved", 2.0), ("dev.module_not_moved", 1.8), ("dev.created_inside", 0.8)),
     rf"(?P<op>\w{{1,60}}): input\(device='?(?P<a>{DEV})'?\) and (?P<param>weight|bias)\(device='?(?P<b>{DEV})'?\)",
     require_pattern=True, after=300,
     alternatives=(("input_weight_type_mismatch", 0.5, "a conv/linear layer whose input and weights sit apart; the "
                    "layer's family when its weights were the ones left behind"),))
_sig("device.first_device", "device_mismatch", "A multi-GPU wrapper got tensors away from its first device",
     ("must be on devices[0]", "(device_ids[0]) but found"),
     "A multi-GPU wrapper (tensor_parallel, DataParallel) needs its inputs and parameters on its first device"
     "[ ({b})], but found one on another device[ ({a})].",
     (("dev.first_device", 3.0), ("dev.module_not_moved", 1.0)),
     rf"on device (?P<b>{DEV}) \(device_ids\[0\]\) but found one of them on device:? (?P<a>{DEV})",
     r"must be on devices\[0\]:? ?(?P<index>\d{1,3})", require_pattern=True, alternatives=(_MIX_ALT,))
_sig("device.cuda_api", "device_mismatch", "A CUDA-only call got a CPU device",
     ("Expected a cuda device, but got:",),
     "A call that only works on {b} was given {a}.",
     (("dev.cuda_api_on_cpu", 2.5), ("dev.module_not_moved", 1.0)),
     rf"Expected a (?P<b>cuda|xpu) device, but got:? (?P<a>{DEV})", require_pattern=True, alternatives=(_Q_ALT,))
# a: the device of the tensor the generator was asked to fill, b: the generator's (torch says it both ways round)
_sig("device.generator", "device_mismatch", "A random generator on one device drew for a tensor on another",
     ("device type for generator but found", "generator device but found", "from a generator of type"),
     "A torch.Generator on {b} was asked for random numbers for a tensor on {a}: a generator only draws for "
     "tensors on its own device.",
     (("dev.generator_device", 3.0), ("dev.cuda_api_on_cpu", 1.0), ("dev.module_not_moved", 0.5)),
     r"Expected a '?(?P<a>\w{1,10})'? device type for generator but found '?(?P<b>\w{1,10})'?",
     rf"Expected a '?(?P<a>{DEV})'? generator device but found '?(?P<b>{DEV})'?",
     r"Cannot generate a (?P<a>\w{1,10}) tensor from a generator of type (?P<b>\w{1,10})", require_pattern=True)
# cuDNN's CTC loss (float32 log_probs on CUDA, int32 targets) reads the targets and lengths on the CPU: CUDA ones
# of int32 pick that path and are refused by its argument check
_sig("device.ctc_cudnn", "device_mismatch", "cuDNN's CTC loss got its targets or lengths on the GPU",
     ("backend (while checking arguments for cudnn_ctc_loss)",),
     "torch's CTC loss took the cuDNN path (int32 targets) and found an argument[ ({arg})] on {b}; cuDNN's CTC reads "
     "targets, input_lengths and target_lengths on the CPU.",
     (("dev.ctc_cudnn", 4.0),),
     r"Expected tensor (?:for argument #\d{1,2} '(?P<arg>\w{1,30})' )?to have (?P<a>\w{1,10}) Backend, but got "
     r"tensor with (?P<b>\w{1,10}) Backend \(while checking arguments for cudnn_ctc_loss\)", require_pattern=True)
_sig("device.mps_placeholder", "device_mismatch", "An MPS operation got a tensor that is not on mps",
     ("Placeholder storage has not been allocated on MPS device",),
     "An operation running on {b} got a tensor that is still on another device (usually the CPU). Every tensor of "
     "one op must sit on the same device.",
     (("dev.inputs_not_moved", 2.0), ("dev.module_not_moved", 1.8), ("dev.created_inside", 0.8)),
     r"allocated on (?P<b>MPS) device", confidence=0.9,
     alternatives=(("backend_op_missing", 0.25, "an op that falls back to the CPU on MPS leaves a CPU tensor"),))
# xformers' memory_efficient_attention (and code built on it: mistral-inference, ComfyUI's attention) checks its
# bias apart: "ValueError: Attention bias and Query/Key/Value should be on the same device"
_sig("device.attention_bias", "device_mismatch", "The attention bias (mask) is on another device than q/k/v",
     ("Attention bias and Query/Key/Value should be on the same device",),
     "The attention bias (the mask) reached the attention kernel on another device than the queries, keys and "
     "values. It is usually built apart from the model: with device='cuda' (the current device, cuda:0) while the "
     "model runs on another GPU, or on the CPU.",
     (("dev.attn_bias_device", 3.0), ("dev.two_gpus_device_map", 1.0), ("dev.created_inside", 0.8)),
     r"(?P<op>Attention bias) and Query/Key/Value should be on the same device", confidence=0.9)
_sig("device.numpy", "device_mismatch", "A GPU tensor was converted to numpy",
     ("device type tensor to numpy",),
     "A tensor on {a} was converted to numpy, which only reads CPU memory.",
     (("dev.numpy_on_gpu", 3.0),),
     rf"can't convert (?P<a>{DEV}) device type tensor to numpy", confidence=0.95)
_sig("indexing.cpu_gpu", "cpu_gpu_indexing", "A CPU tensor was indexed with a GPU index",
     ("indices should be either on cpu or on the same device",),
     "A tensor on {a} was indexed with an index tensor on another device. Indices may live on the CPU or on "
     "the indexed tensor's device, not on a GPU when the tensor is on the CPU.",
     (("ix.table_on_cpu", 3.0),),
     rf"indexed tensor \((?P<a>{DEV})\)", alternatives=(_DEV_ALT,))

# --- conv / linear input vs weight -------------------------------------------------------------------------
_sig("input_weight.types", "input_weight_type_mismatch", "Layer input and its weights differ in device or dtype",
     ("Input type (", "and weight type (", "and bias type ("),
     "A conv/linear layer got an input[ of type {input}] but its {param}[ is {weight}][: {diff}].",
     (("iw.model_not_on_device", 2.0), ("dt.input_not_cast", 1.5)),
     r"Input type \(?(?P<input>[^()\n]{1,60}?)\)? and (?P<param>weight|bias) type \(?(?P<weight>[^()\n]{1,60}?)\)?"
     r" should be the same",
     r"Input type \((?P<input>[^()\n]{1,60})\) and (?P<param>weight|bias) type \((?P<weight>[^()\n]{1,60})\)",
     require_pattern=True, before=20, after=300)
_sig("input_weight.legacy", "input_weight_type_mismatch", "Layer input and its weights differ (older wording)",
     ("to have the same type as tensor for argument",),
     "A conv/linear layer (or its backward) got[ '{arg}'][ of type {input}], not the type of its {param}[ "
     "({weight})][: {diff}].",
     (("iw.model_not_on_device", 2.0), ("dt.input_not_cast", 1.5)),
     r"argument #\d{1,2} '?(?P<arg>\w{1,40})'? to have the same type as tensor for argument #\d{1,2} "
     r"'?(?P<param>\w{1,40})'?;? but type (?P<input>[\w.:]{1,40}) does not equal (?P<weight>[\w.:]{1,40})",
     # the message cut before its types (a paste cut at the window's edge): the pair of arguments still says it
     r"argument #\d{1,2} '(?P<arg>\w{1,40})' to have the same type as tensor for argument #\d{1,2} "
     r"'(?P<param>\w{1,40})'",
     require_pattern=True, before=200, after=500)

# --- loading a checkpoint saved on a device this machine lacks ---------------------------------------------
_sig("deserialize.device", "deserialize_device", "A checkpoint saved on a GPU was loaded where that GPU is missing",
     # "to deserialize": torch 2.x says "Attempting", some retellings "Trying"
     ("to deserialize object on", "deserialize object on a cuda device"),
     "torch.load found tensors saved on {saved} but this process cannot use that device[ (it sees {count} "
     "device(s))].",
     (("ds.cpu_only_load", 3.0), ("ds.gpu_invisible", 1.5)),
     r"object on a (?P<backend>\w{1,10}) device but torch\.\w{1,10}\.is_available\(\) is False",
     r"object on (?P<backend>\w{1,10}) device (?P<index>\d{1,3}) but torch\.\w{1,10}\.device_count\(\) is "
     r"(?P<count>\d{1,3})", confidence=0.95,
     alternatives=(("no_accelerator", 0.35, "this torch sees no GPU at all: a CPU-only build or a missing driver"),))
_sig("deserialize.restore_location", "deserialize_device", "A checkpoint names a device this torch cannot restore",
     ("don't know how to restore data location",),
     "torch.load found storages tagged with {saved}, a device this PyTorch build cannot restore.",
     (("ds.cpu_only_load", 3.0),),
     r"tagged with (?P<saved>[^)\s]{1,40})\)",
     alternatives=(("no_accelerator", 0.35, "the build lacks the device the checkpoint names"),))

# --- a model spread over devices, or still on meta ---------------------------------------------------------
_sig("mixed.ipex_optimize", "mixed_device_model", "ipex.optimize got a model spread over devices",
     ("The model is mixed with different device type",),
     "ipex.optimize / torch.xpu.optimize needs the whole model on one device type, but parameters are on "
     "several (xpu and cpu).",
     (("md.ipex_optimize_mixed", 3.0),), confidence=0.95, alternatives=(_DEV_ALT,))
_sig("mixed.meta_copy", "mixed_device_model", "A meta tensor (no data) was copied",
     ("Cannot copy out of meta tensor",),
     "A tensor on the meta device (a placeholder without data) was copied to a real device.",
     (("md.meta_to", 2.0), ("md.offload_meta", 1.5)), confidence=0.9,
     alternatives=(("quantization_device", 0.25, "quantized weights (bitsandbytes) moved while still on meta"),))
_sig("mixed.fake_tensor", "mixed_device_model", "FakeTensor tracing met two devices",
     ("Unhandled FakeTensor Device Propagation",),
     "While tracing with fake tensors (torch.compile / export / FakeTensorMode), {op} got tensors on {a} and {b}.",
     (("md.fake_input_cpu", 4.0), ("md.fake_tensor", 3.0)),
     rf"Propagation for (?P<op>[\w.]{{1,80}}), found two different devices (?P<a>{DEV}), (?P<b>{DEV})",
     # dynamo prints the failing call's arguments: a first FakeTensor with no device (a CPU one) before parameters
     # on a device is the input the program never moved (``md.fake_input_cpu`` needs ``fake_input``)
     rf"call_function <?(?:built-in function )?(?P<fn>[\w.]{{1,60}})>?\(\*\((?P<fake_input>FakeTensor\(\.\.\., "
     rf"size=\([\d, ]{{0,60}}\)\)), Parameter\(FakeTensor\(\.\.\., device='(?P<wdev>{DEV})'",
     alternatives=(_DEV_ALT,))
_sig("mixed.meta_value", "mixed_device_model", "A weight is still on meta when it was needed",
     ("is on the meta device",),
     "accelerate found {param} on the meta device with no value to load into it[ (target {target})].",
     (("md.offload_meta", 2.5), ("md.meta_to", 1.0)),
     r"(?P<param>[\w.]{1,120}) is on the meta device", rf"to put in on (?P<b>{DEV}|\d{{1,3}})",
     alternatives=(("quantization_device", 0.3, "quantized checkpoints whose weights were not loaded leave meta "
                    "placeholders"),))
_sig("mixed.offloaded_move", "mixed_device_model", "A model with offloaded modules was moved",
     ("You can't move a model that has some modules offloaded",),
     "A model dispatched with some modules offloaded to cpu/disk was moved with .to().",
     (("md.offload_meta", 3.0),), alternatives=(_Q_ALT,))
_sig("mixed.meta_item", "mixed_device_model", "A meta tensor was read",
     ("cannot be called on meta tensors", "meta tensors do not support"),
     "Code read the value of a tensor on the meta device, which has no data.",
     (("md.meta_to", 2.0), ("md.offload_meta", 1.5)), alternatives=(_DEV_ALT,))

# --- quantized weights ---------------------------------------------------------------------------------------
_sig("quant.bnb_same_gpu", "quantization_device", "bitsandbytes got tensors on the CPU and the GPU",
     ("tensors need to be on the same GPU",
      "following tensor and device combinations"),
     "A bitsandbytes kernel got some tensors on the GPU and some on the CPU[ ({devices})].",
     (("q.bnb_state_cpu", 3.0), ("q.bnb_input_cpu", 1.0)), follow=2, confidence=0.9,
     alternatives=(_DEV_ALT,))
_sig("quant.bnb_to", "quantization_device", ".to() is refused on a bitsandbytes model",
     ("is not supported for `4-bit` or `8-bit`", "is not supported for 4-bit or 8-bit",
      "is not supported for `4-bit` quantized", "is not supported for `8-bit` quantized",
      # diffusers' wording when offloading (or .to()) would move a bitsandbytes-quantized component ("... has been
      # loaded in `bitsandbytes` 8bit and moving it to cpu via `.to()` is not supported"); not "bitsandbytes"
      # itself, whose key is in every bitsandbytes frame of a log
      "and moving it to cpu via", "and moving it to cuda via",
      # its "-bit bitsandbytes models" tail, whatever quotes a retelling puts around the bit width
      "bit` bitsandbytes models", "bit\" bitsandbytes models", "bit' bitsandbytes models"),
     "`.to()` / `.cuda()` was called on a model quantized with bitsandbytes.",
     (("q.bnb_to", 3.0),), confidence=0.95, alternatives=(_MIX_ALT,))
_sig("quant.exllama_gpu", "quantization_device", "The GPTQ ExLlama kernels need every module on the GPU",
     ("found modules on cpu/disk", "backend requires all the modules to be on gpu"),
     "A GPTQ model was loaded with some modules on the CPU or disk, and the ExLlama kernels transformers picks "
     "for it run only when every module is on the GPU.",
     (("q.exllama_cpu", 3.0),), confidence=0.95, alternatives=(_MIX_ALT,))
_sig("quant.bnb_dispatch", "quantization_device", "A bitsandbytes model does not fit on the GPU",
     ("some modules are dispatched on the cpu or the disk",),
     "transformers refused to load a bitsandbytes 8/4-bit model because device_map put some of its modules on "
     "the CPU or the disk.",
     (("q.bnb_dispatch", 3.0),), confidence=0.95, follow=2, alternatives=(_MIX_ALT,))
_sig("quant.params_swap", "quantization_device", "A quantized parameter cannot be moved this way",
     ("Creating a Parameter from an instance of type Params4bit", "from an instance of type Int8Params"),
     "Module.to could not re-create a bitsandbytes parameter (typically a move to meta).",
     (("q.bnb_to", 2.5),), confidence=0.85, alternatives=(_MIX_ALT,))
# bitsandbytes quantizes a weight when it first moves to the GPU; one already packed (uint8) whose "already
# quantized" mark was lost (re-wrapped, offloaded and brought back, loaded twice) is quantized again and refused
_sig("quant.bnb_requantize", "quantization_device", "bitsandbytes refused to quantize a tensor of this dtype",
     ("only supports 16/32-bit floats",),
     "bitsandbytes[' blockwise {phase}][ ({bits})] got a[ {dtype}] tensor; it takes only float16, bfloat16 and "
     "float32 tensors.",
     (("q.bnb_requantize", 3.0),),
     r"Blockwise (?:(?P<bits>4-?bit|8-?bit) )?(?P<phase>quantization|dequantization) only supports 16/32-bit floats,? "
     r"but got [\"'`]?(?:torch\.)?(?P<dtype>\w{1,30})", confidence=0.95, before=40, after=300, require_pattern=True,
     alternatives=(("unsupported_dtype_on_device", 0.3, "this bitsandbytes build cannot quantize that dtype here"),))

