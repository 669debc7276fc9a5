"""Error signatures for ``explain``: one entry per error family, with its wordings across PyTorch versions.

A signature is data: literal ``anchors`` (any one of them makes a line worth a look; they are searched with
``str.find``, so a whole log is scanned without a regex), then bounded ``patterns`` that pull fields (devices,
dtypes, op, argument) out of the line. Every pattern is anchored on literal text and uses bounded repetition
only, so matching stays linear on any input. Which causes come first is decided later, from the traceback
context (``_explain_rules``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CATEGORIES", "Signature", "register", "signatures"]

CATEGORIES = (
    "device_mismatch",
    "input_weight_type_mismatch",
    "dtype_mismatch",
    "unsupported_dtype_on_device",
    "backend_op_missing",
    "deserialize_device",
    "no_accelerator",
    "mixed_device_model",
    "quantization_device",
    "cpu_gpu_indexing",
)

# A device as torch prints it; bounded so a pattern can never run away on adversarial text.
DEV = r"(?:cuda|cpu|xpu|mps|meta|hpu|npu|xla|mtia|privateuseone)(?::\d{1,3})?"
_DT = r"[\w:]{1,30}"


@dataclass(frozen=True)
class Signature:
    """One error family.

    ``causes`` are ``(cause id, base weight)``: the ranking before context is considered. ``follow`` is how many
    lines after the matched one still belong to the message (xformers and bitsandbytes print details below it).
    With ``require_pattern`` an anchor alone is not enough (the anchor is a common phrase).
    """

    name: str
    category: str
    title: str
    anchors: tuple[str, ...]
    what: str
    causes: tuple[tuple[str, float], ...]
    patterns: tuple[str, ...] = ()
    confidence: float = 0.9
    follow: int = 0
    require_pattern: bool = False
    before: int = 300  # characters before / after the anchor that the patterns see
    after: int = 2000

    def compiled(self) -> tuple[re.Pattern[str], ...]:
        return _compile(self.patterns)


_COMPILED: dict[tuple[str, ...], tuple[re.Pattern[str], ...]] = {}


def _compile(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    got = _COMPILED.get(patterns)
    if got is None:
        got = _COMPILED[patterns] = tuple(re.compile(p) for p in patterns)
    return got


_REGISTRY: dict[str, Signature] = {}


def register(sig: Signature) -> Signature:
    """Add a signature; a second one with the same name (or an unknown category) is refused."""
    if sig.name in _REGISTRY:
        raise ValueError(f"duplicate explain signature {sig.name!r}")
    if sig.category not in CATEGORIES:
        raise ValueError(f"signature {sig.name!r}: unknown category {sig.category!r}")
    if not sig.anchors or any(not a for a in sig.anchors):
        raise ValueError(f"signature {sig.name!r} needs non-empty literal anchors")
    _REGISTRY[sig.name] = sig
    return sig


def signatures() -> tuple[Signature, ...]:
    return tuple(_REGISTRY.values())


def _sig(name: str, category: str, title: str, anchors: tuple[str, ...], what: str,
         causes: tuple[tuple[str, float], ...], *patterns: str, **kw: object) -> None:
    register(Signature(name, category, title, anchors, what, causes, tuple(patterns), **kw))  # type: ignore[arg-type]


# --- device ------------------------------------------------------------------------------------------------
_sig("device.expected_same", "device_mismatch", "Tensors on two devices met in one operation",
     ("Expected all tensors to be on the same device",),
     "An operation[ ({op})] got tensors on two devices, {a} and {b}[; the argument on the odd device is "
     "'{arg}']. Every tensor of one op must sit on the same device.",
     (("dev.module_not_moved", 2.0), ("dev.inputs_not_moved", 1.5), ("dev.created_inside", 0.5)),
     rf"found at least two devices, (?P<a>{DEV}) and (?P<b>{DEV})",
     rf"but got (?P<arg>\w{{1,40}}) is on (?P<a>{DEV}), different from other tensors on (?P<b>{DEV})",
     r"for argument (?P<arg>\w{1,40}) in method (?P<method>\w{1,80})",
     r"in method (?P<method>\w{1,80})", before=0, after=400)
_sig("device.expected_device", "device_mismatch", "A tensor is not on the device the op expected",
     ("is not on the expected device",),
     "A tensor on {a} reached an operation that runs on {b}.",
     (("dev.module_not_moved", 2.0), ("dev.inputs_not_moved", 1.0), ("dev.created_inside", 1.0)),
     rf"Tensor on device (?P<a>{DEV}) is not on the expected device (?P<b>{DEV})", require_pattern=True)
_sig("device.legacy", "device_mismatch", "Tensors on two devices met in one operation (older PyTorch wording)",
     ("Expected object of device type", "expected device", "but expected it to be on", "at the same device",
      "must be on the same device", "to have the same device as tensor"),
     "An operation got tensors on two devices, {a} and {b}[; the argument on the odd device is '{arg}'].",
     (("dev.module_not_moved", 2.0), ("dev.inputs_not_moved", 1.5)),
     r"Expected object of device type (?P<b>\w{1,10}) but got device type (?P<a>\w{1,10}) for argument "
     r"#\d{1,2} '(?P<arg>\w{1,40})'",
     rf"expected device (?P<b>{DEV}) but got device (?P<a>{DEV})",
     r"argument #\d{1,2} '(?P<arg>\w{1,40})' is on (?P<a>CPU|GPU), but expected it to be on (?P<b>CPU|GPU)",
     rf"All input tensors must be on the same device\. Received (?P<a>{DEV}) and (?P<b>{DEV})",
     rf"found input tensor at (?P<a>{DEV}) and hidden tensor at (?P<b>{DEV})",
     r"tensor for argument #\d{1,2} '(?P<arg>\w{1,40})' to have the same device as tensor", require_pattern=True)
_sig("device.cuda_api", "device_mismatch", "A CUDA-only call got a CPU device",
     ("Expected a cuda device, but got:", "device type for generator but found", "generator device but found"),
     "A call that only works on {b} was given {a}.",
     (("dev.cuda_api_on_cpu", 2.5), ("dev.module_not_moved", 1.0)),
     rf"Expected a (?P<b>cuda|xpu) device, but got: (?P<a>{DEV})",
     r"Expected a '(?P<b>\w{1,10})' device type for generator but found '(?P<a>\w{1,10})'",
     rf"Expected a '(?P<b>{DEV})' generator device but found '(?P<a>{DEV})'", require_pattern=True)
_sig("device.mps_placeholder", "device_mismatch", "An MPS operation got a tensor that is not on mps",
     ("Placeholder storage has not been allocated on MPS device",),
     "An operation running on {b} got a tensor that is still on another device (usually the CPU). Every tensor of "
     "one op must sit on the same device.",
     (("dev.inputs_not_moved", 2.0), ("dev.module_not_moved", 1.8), ("dev.created_inside", 0.8)),
     r"allocated on (?P<b>MPS) device", confidence=0.9)
_sig("device.numpy", "device_mismatch", "A GPU tensor was converted to numpy",
     ("device type tensor to numpy",),
     "A tensor on {a} was converted to numpy, which only reads CPU memory.",
     (("dev.numpy_on_gpu", 3.0),),
     rf"can't convert (?P<a>{DEV}) device type tensor to numpy", confidence=0.95)
_sig("indexing.cpu_gpu", "cpu_gpu_indexing", "A CPU tensor was indexed with a GPU index",
     ("indices should be either on cpu or on the same device as the indexed tensor",),
     "A tensor on {a} was indexed with an index tensor on another device. Indices may live on the CPU or on "
     "the indexed tensor's device, not on a GPU when the tensor is on the CPU.",
     (("ix.table_on_cpu", 3.0),),
     rf"indexed tensor \((?P<a>{DEV})\)")

# --- conv / linear input vs weight -------------------------------------------------------------------------
_sig("input_weight.types", "input_weight_type_mismatch", "Layer input and its weights differ in device or dtype",
     ("Input type (",),
     "A conv/linear layer got an input of type {input} but its {param} is {weight}[: {diff}].",
     (("iw.model_not_on_device", 2.0), ("dt.input_not_cast", 1.5)),
     r"Input type \((?P<input>[^()\n]{1,60})\) and (?P<param>weight|bias) type \((?P<weight>[^()\n]{1,60})\)",
     require_pattern=True, before=0, after=300)

# --- dtype ---------------------------------------------------------------------------------------------------
_sig("dtype.same_dtype", "dtype_mismatch", "Matrix multiply with two different dtypes",
     ("must have the same dtype", "to have the same dtype"),
     "A matrix multiply[ ({lhs} @ {rhs})] got two dtypes[, {a} and {b}]. Both operands must share one dtype.",
     (("dt.input_not_cast", 2.0), ("dt.module_partially_cast", 1.5)),
     rf"(?P<lhs>\w{{1,10}}) and (?P<rhs>\w{{1,10}}) must have the same dtype"
     rf"(?:, but got (?P<a>{_DT}) and (?P<b>{_DT}))?",
     rf"expected (?P<lhs>\w{{1,10}}) and (?P<rhs>\w{{1,10}}) to have the same dtype, "
     rf"but got:? ?(?P<a>{_DT}) ?!= ?(?P<b>{_DT})",
     rf"query\.dtype: (?P<a>{_DT}) key\.dtype: (?P<b>{_DT})", before=40, after=300)
_sig("dtype.scalar_type", "dtype_mismatch", "An operation expected another dtype",
     ("expected scalar type", "Expected object of scalar type", "Found dtype "),
     "An operation expected {b} but got {a}[ (argument '{arg}')].",
     (("dt.input_not_cast", 2.0), ("dt.module_partially_cast", 1.8)),
     r"expected scalar type (?P<b>\w{1,20}) but found (?P<a>\w{1,20})",
     r"Expected object of scalar type (?P<b>\w{1,20}) but got scalar type (?P<a>\w{1,20})"
     r"(?: for argument #\d{1,2} '(?P<arg>\w{1,40})')?",
     r"Found dtype (?P<a>\w{1,20}) but expected (?P<b>\w{1,20})", require_pattern=True)
_sig("dtype.attn_mask", "dtype_mismatch", "An attention mask in the wrong dtype",
     ("Expected attn_mask dtype to be bool or float",),
     "scaled_dot_product_attention got a mask of dtype {a}[ with a {b} query]; it needs a bool mask or one in the "
     "query's dtype.",
     (("dt.mask_dtype", 3.0),),
     rf"attn_mask\.dtype: (?P<a>[\w: ]{{1,30}}?) and +query\.dtype: (?P<b>{_DT})", confidence=0.9)
_sig("dtype.mixed_cpu", "dtype_mismatch", "Normalization on the CPU with mixed dtypes",
     ("mixed dtype (CPU)",),
     "A normalization layer on the CPU got its input and parameters in different dtypes[ (it expected the "
     "{what} to be {b})]. On the CPU, LayerNorm/GroupNorm need them in one dtype.",
     (("dt.cpu_norm_mixed", 2.5), ("dt.module_partially_cast", 1.0)),
     r"expect (?P<what>parameter|input) to have scalar type of (?P<b>\w{1,20})")

_sig("dtype.index_type", "dtype_mismatch", "Indices in a floating-point (or wrong integer) dtype",
     ("'indices' to have", "tensors used as indices must be long"),
     "The indices of an indexing op[ ({op})] must be integer[ ({want})][, but they were {got}].",
     (("dt.index_cast", 3.0), ("dt.input_not_cast", 0.5)),
     r"'indices' to have (?:one of the following scalar types: |scalar type )(?P<want>[\w, ]{1,30});? but got "
     r"(?P<got>[\w.]{1,40}) instead(?: \(while checking arguments for (?P<op>\w{1,40})\))?",
     r"tensors used as indices must be (?P<want>long, int)", require_pattern=True, confidence=0.9)
_sig("dtype.write_source", "dtype_mismatch", "Values written into a tensor of another dtype",
     ("Index put requires the source and destination dtypes match", "Expected self.dtype to be equal to src.dtype",
      "must have the same scalar type", "to have same dtypes but got"),
     "An in-place write ({op}) got values in another dtype than the tensor written to[: {a} destination, {b} "
     "source].",
     (("dt.write_source", 3.0), ("dt.module_partially_cast", 1.0)),
     r"got (?P<a>\w{1,20}) for the destination and (?P<b>\w{1,20}) for the source",
     r"(?P<op>\w{1,40})\(\): (?:Expected self\.dtype|self \((?P<a>\w{1,20})\) and source \((?P<b>\w{1,20})\))",
     r"(?P<op>\w{1,40}): expected self and source to have same dtypes", r"(?P<op>Index put) requires",
     require_pattern=True, confidence=0.9)

# --- dtype not supported on the device ---------------------------------------------------------------------
_sig("unsupported.kernel", "unsupported_dtype_on_device", "No kernel for this dtype on this device",
     ("not implemented for '",),
     "The kernel {kernel} has no {dtype} implementation[ on {device}].",
     (("ud.half_on_cpu", 2.0), ("ud.kernel_missing", 1.0)),
     r"\"(?P<kernel>\w{1,80})\" not implemented for '(?P<dtype>\w{1,30})'", require_pattern=True)
_sig("unsupported.mps_fp64", "unsupported_dtype_on_device", "MPS has no float64",
     ("Cannot convert a MPS Tensor to float64",),
     "A float64 tensor was moved to (or created on) mps; Apple's MPS has no float64.",
     (("ud.mps_fp64", 3.0),), confidence=0.95)
_sig("unsupported.mps_bf16", "unsupported_dtype_on_device", "bfloat16 is not available on this MPS setup",
     ("BFloat16 is not supported on MPS", "to the MPS backend but it does not have support for that dtype"),
     "A {dtype} tensor was sent to mps, which does not support it on this macOS / chip / PyTorch.",
     (("ud.mps_bf16", 3.0),),
     r"Trying to convert (?P<dtype>\w{1,20}) to the MPS backend", confidence=0.95)
_sig("unsupported.scaled_mm", "unsupported_dtype_on_device", "fp8 scaled matmul needs a newer GPU",
     ("_scaled_mm is only supported on",),
     "An fp8 matmul (torch._scaled_mm) ran on a GPU below compute capability[ {need}] 8.9.",
     (("ud.scaled_mm_capability", 3.0),),
     r"compute capability >= (?P<need>[\d.]{1,4})", confidence=0.95)
_sig("unsupported.cublas_bf16", "unsupported_dtype_on_device", "This GPU has no bfloat16 matrix multiply",
     ("CUBLAS_STATUS_NOT_SUPPORTED", "Bfloat16 is only supported on GPUs", "does not support bfloat16"),
     "A bfloat16 matrix multiply ran on a GPU[ of compute capability {cap}] below 8.0 (P100, V100, T4, "
     "GTX/RTX 20xx, M40), which has no bf16 GEMM in cuBLAS.",
     (("ud.bf16_old_gpu", 3.0),),
     r"CUDA_R_16BF", r"compute capability (?:of at least 8\.0\. .{0,60}?has compute capability )?(?P<cap>\d\.\d)",
     r"Current CUDA Device does not support bfloat16", require_pattern=True, confidence=0.85, follow=3)
_sig("unsupported.fp8_promotion", "unsupported_dtype_on_device", "float8 cannot be mixed with other dtypes",
     ("Promotion for Float8 Types is not supported",),
     "A float8 tensor met a tensor of another dtype ({a} and {b}); PyTorch does not promote float8.",
     (("ud.fp8_promotion", 3.0),),
     r"attempted to promote (?P<a>\w{1,30}) and (?P<b>\w{1,30})")

# --- an op without a kernel for that backend ---------------------------------------------------------------
_sig("backend.could_not_run", "backend_op_missing", "An operator has no kernel for this backend",
     ("arguments from the '", "is only available for these backends"),
     "The operator {op} was called with {backend} tensors but has kernels only for other backends[ "
     "({available_short})].",
     (("bo.kernel_device_only", 1.5),),
     r"Could not run '(?P<op>[^'\s]{1,120})' with arguments from the '(?P<backend>\w{1,40})' backend",
     r"'(?P<op>[^'\s]{1,120})' is only available for these backends: \[(?P<available>[^\]\n]{0,1500})\]",
     r"arguments from the '(?P<backend>\w{1,40})' backend", require_pattern=True)
_sig("backend.mps_not_implemented", "backend_op_missing", "An operator is not implemented for MPS",
     ("is not currently implemented for the MPS device", "is not current implemented for the MPS device"),
     "The operator {op} has no MPS kernel in this PyTorch.",
     (("bo.mps_fallback", 3.0),),
     r"The operator '(?P<op>[^'\s]{1,120})' is not current", r"for the (?P<backend>MPS) device", confidence=0.95)
_sig("backend.xformers", "backend_op_missing", "xformers has no kernel for these inputs",
     ("No operator found for `memory_efficient_attention",),
     "xformers found no attention kernel for {op} with these inputs[ ({dtype})] on this GPU.",
     (("bo.xformers_no_kernel", 3.0),),
     r"No operator found for `(?P<op>\w{1,60})`", r"\(torch\.(?P<dtype>\w{1,20})\)", follow=24)
_sig("backend.op_not_exist", "backend_op_missing", "A compiled extension operator is missing",
     ("does not exist",),
     "The operator {op} is not registered: the extension's compiled library did not load for this torch.",
     (("bo.torchvision_mismatch", 3.0),),
     r"operator (?P<op>\w{1,40}::\w{1,60}) does not exist", require_pattern=True)

# --- loading a checkpoint saved on a device this machine lacks ---------------------------------------------
_sig("deserialize.device", "deserialize_device", "A checkpoint saved on a GPU was loaded where that GPU is missing",
     ("Attempting to deserialize object on",),
     "torch.load found tensors saved on {saved} but this process cannot use that device[ (it sees {count} "
     "device(s))].",
     (("ds.cpu_only_load", 3.0), ("ds.gpu_invisible", 1.5)),
     r"object on a (?P<backend>\w{1,10}) device but torch\.\w{1,10}\.is_available\(\) is False",
     r"object on (?P<backend>\w{1,10}) device (?P<index>\d{1,3}) but torch\.\w{1,10}\.device_count\(\) is "
     r"(?P<count>\d{1,3})", confidence=0.95)
_sig("deserialize.restore_location", "deserialize_device", "A checkpoint names a device this torch cannot restore",
     ("don't know how to restore data location",),
     "torch.load found storages tagged with {saved}, a device this PyTorch build cannot restore.",
     (("ds.cpu_only_load", 3.0),),
     r"tagged with (?P<saved>[^)\s]{1,40})\)")

# --- no accelerator ------------------------------------------------------------------------------------------
_sig("no_accel.not_compiled", "no_accelerator", "This PyTorch has no CUDA",
     ("Torch not compiled with CUDA enabled",),
     "Code asked for CUDA, but the installed PyTorch was built without CUDA support.",
     (("na.cpu_build", 2.0), ("na.hardcoded_cuda", 1.8)), confidence=0.95)
_sig("no_accel.no_driver", "no_accelerator", "No usable NVIDIA GPU or driver",
     ("Found no NVIDIA driver on your system", "No CUDA GPUs are available", "NVIDIA driver on your system is too old",
      "CUDA driver initialization failed"),
     "Code asked for CUDA, but no NVIDIA driver / GPU is usable in this process.",
     (("na.no_driver", 2.0), ("na.hardcoded_cuda", 1.8)), confidence=0.9)
_sig("no_accel.ordinal", "no_accelerator", "A GPU index that does not exist",
     ("invalid device ordinal",),
     "Code asked for a GPU index this process does not have.",
     (("na.ordinal", 3.0),), confidence=0.9)
_sig("no_accel.arch", "no_accelerator", "This PyTorch has no kernels for this GPU",
     ("no kernel image is available for execution on the device",),
     "The GPU is there, but the installed PyTorch (or an extension) was not compiled for its architecture.",
     (("na.arch_not_in_build", 3.0),), confidence=0.9)
_sig("no_accel.not_linked", "no_accelerator", "This PyTorch has no support for that device type",
     ("is not linked with support for",),
     "Code used '{backend}' tensors, but this PyTorch build has no {backend} backend.",
     (("na.not_linked", 3.0),),
     r"not linked with support for (?P<backend>\w{1,20}) devices", confidence=0.9)
_sig("no_accel.backend_absent", "no_accelerator", "The device backend is not available in this build",
     ("not built with MPS enabled", "MPS backend is supported on MacOS", "has no attribute 'xpu'",
      "Cannot access accelerator device when none is available"),
     "Code asked for a device backend this PyTorch install does not provide.",
     (("na.not_linked", 3.0),), confidence=0.85)

# --- a model spread over devices, or still on meta ---------------------------------------------------------
_sig("mixed.ipex_optimize", "mixed_device_model", "ipex.optimize got a model spread over devices",
     ("The model is mixed with different device type",),
     "ipex.optimize / torch.xpu.optimize needs the whole model on one device type, but parameters are on "
     "several (xpu and cpu).",
     (("md.ipex_optimize_mixed", 3.0),), confidence=0.95)
_sig("mixed.meta_copy", "mixed_device_model", "A meta tensor (no data) was copied",
     ("Cannot copy out of meta tensor",),
     "A tensor on the meta device (a placeholder without data) was copied to a real device.",
     (("md.meta_to", 2.0), ("md.offload_meta", 1.5)), confidence=0.9)
_sig("mixed.fake_tensor", "mixed_device_model", "FakeTensor tracing met two devices",
     ("Unhandled FakeTensor Device Propagation",),
     "While tracing with fake tensors (torch.compile / export / FakeTensorMode), {op} got tensors on {a} and {b}.",
     (("md.fake_tensor", 3.0),),
     rf"Propagation for (?P<op>[\w.]{{1,80}}), found two different devices (?P<a>{DEV}), (?P<b>{DEV})")
_sig("mixed.meta_value", "mixed_device_model", "A weight is still on meta when it was needed",
     ("is on the meta device, we need a `value`",),
     "accelerate found {param} on the meta device with no value to load into it.",
     (("md.offload_meta", 2.5), ("md.meta_to", 1.0)),
     r"(?P<param>[\w.]{1,120}) is on the meta device")
_sig("mixed.offloaded_move", "mixed_device_model", "A model with offloaded modules was moved",
     ("You can't move a model that has some modules offloaded",),
     "A model dispatched with some modules offloaded to cpu/disk was moved with .to().",
     (("md.offload_meta", 3.0),))
_sig("mixed.meta_item", "mixed_device_model", "A meta tensor was read",
     ("cannot be called on meta tensors",),
     "Code read the value of a tensor on the meta device, which has no data.",
     (("md.meta_to", 2.0), ("md.offload_meta", 1.5)))

# --- quantized weights ---------------------------------------------------------------------------------------
_sig("quant.bnb_same_gpu", "quantization_device", "bitsandbytes got tensors on the CPU and the GPU",
     ("All input tensors need to be on the same GPU",),
     "A bitsandbytes kernel got some tensors on the GPU and some on the CPU[ ({devices})].",
     (("q.bnb_state_cpu", 3.0), ("q.bnb_input_cpu", 1.0)), follow=2, confidence=0.9)
_sig("quant.bnb_to", "quantization_device", ".to() is refused on a bitsandbytes model",
     ("is not supported for `4-bit` or `8-bit`",),
     "`.to()` / `.cuda()` was called on a model quantized with bitsandbytes.",
     (("q.bnb_to", 3.0),), confidence=0.95)
_sig("quant.params_swap", "quantization_device", "A quantized parameter cannot be moved this way",
     ("Creating a Parameter from an instance of type Params4bit", "from an instance of type Int8Params"),
     "Module.to could not re-create a bitsandbytes parameter (typically a move to meta).",
     (("q.bnb_to", 2.5),), confidence=0.85)
