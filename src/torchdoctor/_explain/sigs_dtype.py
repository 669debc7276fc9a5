"""Signatures of dtype errors, kernels missing for a dtype or backend, and missing accelerators.

Data only (see ``signatures`` for the fields).
"""

from __future__ import annotations

from torchdoctor._explain.signatures import DT as _DT
from torchdoctor._explain.signatures import define as _sig

__all__: list[str] = []

_IW_ALT = ("input_weight_type_mismatch", 0.3, "a conv/linear layer whose weights were cast differently from its "
           "input gives this message on some paths")
_UD_ALT = ("unsupported_dtype_on_device", 0.3, "the dtype has no kernel on this device, so one side was left in "
           "another dtype")
_DT_ALT = ("dtype_mismatch", 0.3, "one operand was left in another dtype than the rest")
_NA_ALT = ("no_accelerator", 0.35, "this torch build lacks the device backend altogether")
_BO_ALT = ("backend_op_missing", 0.3, "a compiled extension does not match this torch build")

# --- dtype ---------------------------------------------------------------------------------------------------
_sig("dtype.same_dtype", "dtype_mismatch", "Matrix multiply with two different dtypes",
     ("must have the same dtype", "to have the same dtype"),
     "A matrix multiply[ ({lhs} @ {rhs})] got two dtypes[, {a} and {b}]. Both operands must share one dtype.",
     (("dt.input_not_cast", 2.0), ("dt.module_partially_cast", 1.5)),
     rf"(?P<lhs>\w{{1,10}}) and (?P<rhs>\w{{1,10}}) must have the same dtype"
     rf"(?:,? but got (?P<a>{_DT}) and (?P<b>{_DT}))?",
     rf"expected (?P<lhs>\w{{1,10}}) and (?P<rhs>\w{{1,10}}) to have the same dtype, "
     rf"but got:? ?(?P<a>{_DT}) ?!= ?(?P<b>{_DT})",
     r"expected (?P<lhs>\w{1,10}) and (?P<rhs>\w{1,10}) to have the same dtype",
     # any other wording of the anchors, but attention's (its own signature below)
     r"must have the same dtype", r"(?<!value )to have the same dtype",
     before=40, after=300, require_pattern=True, alternatives=(_IW_ALT, _UD_ALT))
# scaled_dot_product_attention: "Expected query, key, and value to have the same dtype, but got query.dtype: ...
# key.dtype: ... and value.dtype: ... instead." Field a is the operand that differs from the query (the key, or the
# value where the key has the query's dtype), b the query's dtype: what the odd operand is cast to.
_QKV = r"(?P<{0}>(?:struct )?[\w:]{{1,30}})"
_sig("dtype.attention_qkv", "dtype_mismatch", "Attention got query, key and value in different dtypes",
     ("and value to have the same dtype", "and value.dtype:"),  # the second: the message cut before "but got"
     "Attention (scaled_dot_product_attention) got query, key and value in different dtypes[: the query is {b}, "
     "the {other} {a}]. All three must share one dtype.",
     (("dt.input_not_cast", 2.0), ("dt.module_partially_cast", 1.5)),
     rf"query\.dtype: {_QKV.format('b')},? key\.dtype: (?:struct )?(?P=b),? and (?P<other>value)\.dtype: "
     + _QKV.format("a"),
     rf"query\.dtype: {_QKV.format('b')},? (?P<other>key)\.dtype: {_QKV.format('a')}",
     before=40, after=300, alternatives=(_IW_ALT, _UD_ALT))
_sig("dtype.scalar_type", "dtype_mismatch", "An operation expected another dtype",
     ("expected scalar type", "Expected object of scalar type", "Found dtype "),
     "An operation expected {b} but got {a}[ (argument '{arg}')].",
     (("dt.input_not_cast", 2.0), ("dt.module_partially_cast", 1.8)),
     r"expected scalar type (?P<b>[\w.:]{1,30}) but found (?P<a>[\w.:]{1,30})",
     r"Expected object of scalar type (?P<b>[\w.:]{1,30}) but got scalar type (?P<a>[\w.:]{1,30})"
     r"(?: for argument #\d{1,2} '?(?P<arg>\w{1,40})'?)?",
     r"Found dtype (?P<a>\w{1,20}) but expected (?P<b>\w{1,20})", require_pattern=True,
     alternatives=(_IW_ALT, _UD_ALT))
_sig("dtype.out_cast", "dtype_mismatch", "A result cannot be written into a tensor of a narrower dtype",
     ("to the desired output type", "Expected out tensor to have dtype", "for `out` but got dtype"),
     "An in-place op or an out= tensor would store a {a} result in a {b} tensor[ ({op})], which PyTorch refuses "
     "(in-place ops keep the left side's dtype).",
     (("dt.out_cast", 3.0), ("dt.input_not_cast", 0.5)),
     r"result type (?P<a>[\w.:]{1,30}) can't be cast to the desired output type (?P<b>long int|[\w.:]{1,30})",
     r"Expected out tensor to have dtype (?P<a>[\w.:]{1,30}), but got (?P<b>[\w.:]{1,30}) instead",
     r"expected dtype (?P<a>[\w.:]{1,30}) for `out` but got dtype (?P<b>[\w.:]{1,30})",
     require_pattern=True, confidence=0.9, alternatives=(_UD_ALT,))
_sig("dtype.attn_mask", "dtype_mismatch", "An attention mask in the wrong dtype",
     ("Expected attn_mask dtype to be bool or float",),
     "scaled_dot_product_attention got a mask of dtype {a}[ with a {b} query]; it needs a bool mask or one in the "
     "query's dtype.",
     (("dt.mask_dtype", 3.0),),
     rf"attn_mask\.dtype: (?P<a>[\w: ]{{1,30}}?) and +query\.dtype: (?P<b>{_DT})", confidence=0.9,
     alternatives=(_UD_ALT,))
# torch.amp.GradScaler.unscale_ (a model trained in float16 itself, not under autocast)
_sig("dtype.unscale_fp16", "dtype_mismatch", "GradScaler found float16 gradients",
     ("to unscale FP16 gradients",),
     "GradScaler was asked to unscale float16 gradients: the parameters being trained are float16 themselves. "
     "Mixed precision keeps float32 weights and computes in float16 under autocast.",
     (("dt.fp16_master_weights", 3.0),), confidence=0.9)
# the same scaler over bfloat16 gradients: its CUDA kernel has no bfloat16 (HERMES#12, trl#4901, pytorch#127176)
_sig("dtype.unscale_bf16", "dtype_mismatch", "GradScaler met bfloat16 gradients",
     ("_amp_foreach_non_finite_check_and_unscale",),
     "GradScaler's unscale step ({op}) got bfloat16 gradients: the parameters being trained are bfloat16 "
     "themselves, and bfloat16 needs no loss scaling.",
     (("dt.bf16_no_scaler", 3.0),),
     r"(?P<op>_amp_foreach_non_finite_check_and_unscale\w{0,10})\W{1,3} not implemented for \W?(?P<a>BFloat16)",
     require_pattern=True, confidence=0.97)
# lerp / addcmul-style ops name the operand that differs: "expected dtype float for `end` but got dtype BFloat16"
_sig("dtype.operand_expected", "dtype_mismatch", "One operand of an operation in another dtype",
     ("for `end` but got dtype", "for end but got dtype", "for `weight` but got dtype"),
     "An operation (lerp, addcmul and the like) got one operand in another dtype than the rest[: its `{arg}` is "
     "{a}, the others are {b}].",
     (("dt.operand_cast", 3.0), ("dt.module_partially_cast", 1.0)),
     r"expected dtype (?:torch\.)?(?P<b>[\w:]{1,30}) for [`'\"]?(?P<arg>end|weight)[`'\"]? but got dtype "
     r"(?:torch\.)?(?P<a>[\w:]{1,30})",
     require_pattern=True, confidence=0.9, before=40, after=300, alternatives=(_UD_ALT,))
# the memory-efficient sdpa kernel's check of an additive mask (attn_bias) against the query
_sig("dtype.attn_bias", "dtype_mismatch", "An attention mask (bias) in another dtype than the query",
     ("invalid dtype for bias - should match query",),
     "scaled_dot_product_attention got an additive mask (attn_bias) whose dtype differs from the query's; the "
     "memory-efficient kernel needs them in one dtype.",
     (("dt.mask_dtype", 3.0),), confidence=0.9, alternatives=(_UD_ALT,))
_sig("dtype.mixed_cpu", "dtype_mismatch", "Normalization on the CPU with mixed dtypes",
     ("mixed dtype (CPU)",),
     "A normalization layer on the CPU got its input and parameters in different dtypes[ (it expected the "
     "{what} to be {b})]. On the CPU, LayerNorm/GroupNorm need them in one dtype.",
     (("dt.cpu_norm_mixed", 2.5), ("dt.module_partially_cast", 1.0)),
     r"expect (?P<what>parameter|input) to have scalar type of (?P<b>\w{1,20})",
     alternatives=(("unsupported_dtype_on_device", 0.45, "the CPU runs this norm only with matching dtypes: a "
                    "half-precision model that landed on the CPU"), _IW_ALT))

_sig("dtype.rnn_input", "dtype_mismatch", "An RNN/LSTM/GRU input in another dtype than its weights",
     ("RNN input dtype", "input must have the type "),
     "An RNN layer (nn.RNN / LSTM / GRU) got its input in {a} while its weights are {b}; torch checks this in "
     "Python before any kernel runs.",
     (("dt.input_not_cast", 3.0), ("dt.module_partially_cast", 1.0)),
     r"RNN input dtype \((?:torch\.)?(?P<a>\w{1,20})\) does not match weight dtype \((?:torch\.)?(?P<b>\w{1,20})\)",
     r"input must have the type (?:torch\.)?(?P<b>\w{1,20}), got type (?:torch\.)?(?P<a>\w{1,20})",
     require_pattern=True, confidence=0.9, alternatives=(_UD_ALT,))
_sig("dtype.index_type", "dtype_mismatch", "Indices in a floating-point (or wrong integer) dtype",
     ("'indices' to have", "#1 indices to have", "tensors used as indices must be long"),
     "The indices of an indexing op[ ({op})] must be integer[ ({want})][, but they were {got}].",
     (("dt.index_cast", 3.0), ("dt.input_not_cast", 0.5)),
     # also retyped by hand: "for argument #1 indices to have one of the following scalar types Long,Int but got
     # toech.cuda.floatTensor in stead"
     r"'?indices'? to have (?:one of the following scalar types:? |scalar type )(?P<want>[\w, ]{1,30});? but got "
     r"(?P<got>[\w.]{1,40}) in ?stead(?: \(while checking arguments for (?P<op>\w{1,40})\))?",
     r"tensors used as indices must be (?P<want>long, int)", require_pattern=True, confidence=0.9,
     alternatives=(("cpu_gpu_indexing", 0.2, "indexing errors about the index tensor's device read alike"),))
_sig("dtype.write_source", "dtype_mismatch", "Values written into a tensor of another dtype",
     ("Index put requires the source and destination dtypes match", "Expected self.dtype to be equal to src.dtype",
      "must have the same scalar type", "to have same dtypes but got"),
     "An in-place write ({op}) got values in another dtype than the tensor written to[: {a} destination, {b} "
     "source].",
     (("dt.write_source", 3.0), ("dt.module_partially_cast", 1.0)),
     r"got (?P<a>\w{1,20}) for the destination and (?P<b>\w{1,20}) for the source",
     r"(?P<op>\w{1,40})\(\): (?:Expected self\.dtype|self \((?P<a>\w{1,20})\) and source \((?P<b>\w{1,20})\))",
     r"(?P<op>\w{1,40}): expected self and source to have same dtypes", r"(?P<op>Index put) requires",
     require_pattern=True, confidence=0.9, alternatives=(_UD_ALT,))

# --- dtype not supported on the device ---------------------------------------------------------------------
_sig("unsupported.kernel", "unsupported_dtype_on_device", "No kernel for this dtype on this device",
     ("not implemented for '", 'not implemented for "', "not implemented for `"),
     "The kernel {kernel} has no implementation[ for {dtype}][ on {device}].",
     (("ud.half_on_cpu", 2.0), ("ud.kernel_missing", 1.0)),
     # the kernel and the dtype come quoted in every way a paste or a markdown editor quotes them
     # a dispatch key in the dtype's place ("... is not implemented for `SparseMPS`") is a layout, not a dtype, and
     # an attention implementation there (transformers' "Sliding Window Attention is enabled but not implemented for
     # `sdpa`", a warning in every Qwen2 log) is none either
     r"[\"'`]?(?P<kernel>\w{1,80})[\"'`]? not implemented for [\"'`]?(?P<dtype>(?!Sparse|sdpa\b)\w{1,30})[\"'`]?",
     require_pattern=True,
     alternatives=(_DT_ALT, ("backend_op_missing", 0.25, "the op has no kernel for this device at all")))
# the kernel's message retold in words ("Slow conv2d cpu not implemented in half."): no quotes, spaces for the
# underscores; the kernel must come right before the phrase, so prose that only mentions half precision is not read
_sig("unsupported.kernel_words", "unsupported_dtype_on_device", "No kernel for this dtype on this device",
     ("not implemented in half", "not implemented for half", "not implemented in bfloat16",
      "not implemented for bfloat16", "not implemented in float16", "not implemented for float16"),
     "The kernel {kernel} has no implementation[ for {dtype}][ on {device}].",
     (("ud.half_on_cpu", 2.0), ("ud.kernel_missing", 1.0)),
     r"(?P<kernel>[a-z][\w]{1,40}(?: [\w]{1,40}){0,3})[\"'`]? not implemented (?:in|for) (?P<dtype>half|bfloat16|float16)"
     r"(?=\s*(?:[.!,;:'\"`)]|$))", require_pattern=True, confidence=0.8,
     alternatives=(_DT_ALT, ("backend_op_missing", 0.25, "the op has no kernel for this device at all")))
# a torch build that refuses a dtype on its platform below some version (float8 on ROCm before 6.5)
_sig("unsupported.dtype_platform", "unsupported_dtype_on_device", "This torch build refuses the dtype here",
     ("is only supported for rocm", "is only supported on rocm"),
     "A[ {dtype}] tensor (an fp8 checkpoint's weights) was created on a GPU whose torch build refuses that "
     "dtype[ below {backend} {need}].",
     (("ud.dtype_platform", 3.0),),
     r"(?P<dtype>float8_?\w{0,12}|\w{1,20}) is only supported (?:for|on) (?P<backend>ROCm) ?(?P<need>[\d.]{1,6})?",
     require_pattern=True, confidence=0.9, alternatives=(_NA_ALT,))
# the FFT libraries have no bfloat16 (and float16 only for powers of two): cuFFT, MKL, pocketfft
_sig("unsupported.fft_dtype", "unsupported_dtype_on_device", "The FFT has no kernel for this dtype",
     ("fft doesn't support tensor", "fft does not support tensor", "fft only supports dimensions whose sizes are "
      "powers of two when computing in half precision"),
     "An FFT got a[ {dtype}] input, a dtype its library has no transform for on this device.",
     (("ud.fft_dtype", 3.0),),
     r"FFT (?:doesn't|does not) support tensors? of type:? ?(?P<dtype>\w{1,20})",
     r"FFT only supports dimensions whose sizes are powers of two when computing in (?P<dtype>half) precision",
     confidence=0.9, alternatives=(_DT_ALT,))
_sig("unsupported.complex", "unsupported_dtype_on_device", "torch.complex / polar has no kernel for this dtype",
     ("Expected both inputs to be Half, Float or Double tensors",),
     "torch.complex / torch.polar got {a} inputs; they accept only float16, float32 and float64 (no bfloat16).",
     (("ud.complex_dtype", 3.0),),
     r"Half, Float or Double tensors but got (?P<a>[\w.:]{1,30}) and (?P<b>[\w.:]{1,30})", confidence=0.9,
     alternatives=(_DT_ALT,))
_sig("unsupported.flash_attn", "unsupported_dtype_on_device", "FlashAttention runs only in float16 / bfloat16",
     ("FlashAttention only support fp16 and bf16", "FlashAttention only supports fp16 and bf16",
      "flash attention only supports fp16"),
     "FlashAttention got inputs in another dtype[ ({a})]: its kernels exist only for float16 and bfloat16.",
     (("ud.flash_fp32", 3.0),), r"dtype[=: ]{1,2}(?:torch\.)?(?P<a>float32|float64)", confidence=0.9,
     alternatives=(_DT_ALT, ("backend_op_missing", 0.2, "the flash-attn build has no kernel for these inputs")))
_sig("unsupported.mps_fp64", "unsupported_dtype_on_device", "MPS has no float64",
     ("Cannot convert a MPS Tensor to float64",),
     "A float64 tensor was moved to (or created on) mps; Apple's MPS has no float64.",
     (("ud.mps_fp64", 3.0),), confidence=0.95)
_sig("unsupported.mps_bf16", "unsupported_dtype_on_device", "bfloat16 is not available on this MPS setup",
     ("BFloat16 is not supported on MPS", "to the MPS backend but it does not have support for that dtype"),
     "A[ {dtype}] tensor was sent to mps, which does not support it on this macOS / chip / PyTorch.",
     (("ud.mps_bf16", 3.0),),
     r"Trying to convert (?P<dtype>(?!float8)\w{1,20}) to the MPS backend", r"(?P<dtype>BFloat16) is not supported on MPS",
     require_pattern=True, confidence=0.95)
# float8 shares the wording above but not its answer: Metal has no float8 on any macOS, so "update macOS" (the
# bfloat16 answer) is wrong for it
_sig("unsupported.mps_fp8", "unsupported_dtype_on_device", "MPS has no float8",
     ("to the MPS backend but it does not have support for that dtype", "mps does not support float8",
      "mps backend does not support float8", "trying to convert float8"),
     "A[ {dtype}] tensor (an fp8 checkpoint's weights) was sent to mps; Apple's MPS has no float8 type on any macOS "
     "or chip.",
     (("ud.mps_fp8", 3.0),),
     r"Trying to convert (?P<dtype>float8_?\w{0,12}) to the MPS backend",
     r"MPS (?:backend )?does not support (?P<dtype>float8_?\w{0,12})",
     # the head alone: only MPS words a refused dtype "Trying to convert X to"; the tail may be cut or letter-spaced
     r"Trying to convert (?P<dtype>float8_?\w{0,12}) to\b", require_pattern=True, confidence=0.95)
_sig("unsupported.numpy_dtype", "unsupported_dtype_on_device", "numpy has no type for this tensor's dtype",
     ("got unsupported scalartype",),
     "A[ {dtype}] tensor was converted to numpy, which has no such type.",
     (("ud.numpy_dtype", 3.0),),
     r"Got unsupported ScalarType (?P<dtype>\w{1,20})", require_pattern=True, confidence=0.9)
_sig("unsupported.xpu_fp64", "unsupported_dtype_on_device", "This Intel GPU has no float64",
     ("required aspect fp64 is not supported", "double type is not supported on this platform", "uses-fp64-math"),
     "A float64 tensor reached an Intel GPU (XPU) that has no float64 support.",
     (("ud.xpu_fp64", 3.0),), confidence=0.9)
_sig("unsupported.mps_input_type", "unsupported_dtype_on_device", "An MPS kernel refuses this input dtype",
     ("does not support input type",),
     "The MPS kernel[ {kernel}] has no implementation[ for {dtype} inputs] in this PyTorch.",
     (("ud.kernel_missing", 3.0),),
     r"Operation '?(?P<kernel>\w{1,80})(?:\(\))?'? does not support input type '?(?P<dtype>\w{1,20})'?"
     r"(?: in (?P<backend>MPS) backend)?", require_pattern=True, confidence=0.9,
     alternatives=(("backend_op_missing", 0.3, "the op has no MPS kernel for any dtype in older releases"),))
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
     require_pattern=True, confidence=0.85, follow=3,  # autocast's "Current CUDA Device does not support bfloat16":
     # sigs_thirteen's unsupported.autocast_bf16
     alternatives=(_BO_ALT,))
_sig("unsupported.fp8_promotion", "unsupported_dtype_on_device", "float8 cannot be mixed with other dtypes",
     ("Promotion for Float8 Types is not supported",),
     "A float8 tensor met a tensor of another dtype ({a} and {b}); PyTorch does not promote float8.",
     (("ud.fp8_promotion", 3.0),),
     r"attempted to promote (?P<a>\w{1,30}) and (?P<b>\w{1,30})", alternatives=(_DT_ALT,))

# --- an op without a kernel for that backend ---------------------------------------------------------------
_sig("backend.could_not_run", "backend_op_missing", "An operator has no kernel for the backend it was called with",
     ("arguments from the '", 'arguments from the "', "arguments from the `", "is only available for these backends",
      "with arguments from the ", "could not run 'aten::", "could not run `aten::", 'could not run "aten::'),
     "The operator {op} was called with[ {backend}] tensors but has kernels only for other backends[ "
     "({available_short})].",
     (("bo.kernel_device_only", 1.5),),
     r"Could not run [\"'`]?(?P<op>[^\"'`\s]{1,120}?)[\"'`]? with arguments from the [\"'`]?(?P<backend>\w{1,40})"
     r"[\"'`]? backend",
     r"[\"'`]?(?P<op>[^\"'`\s]{1,120}?)[\"'`]? is only available for these backends: \[(?P<available>[^\]]{0,4000})\]",
     r"arguments from the [\"'`]?(?P<backend>\w{1,40})[\"'`]? backend",
     r"Could not run [\"'`](?P<op>aten::[\w.]{1,80})[\"'`]", require_pattern=True, after=5000,
     alternatives=(_NA_ALT, ("unsupported_dtype_on_device", 0.15, "the kernel exists for other dtypes only")))
_sig("backend.mps_not_implemented", "backend_op_missing", "An operator is not implemented for MPS",
     ("not currently implemented for the MPS device", "not current implemented for the MPS device"),
     "The operator {op} has no MPS kernel in this PyTorch.",
     (("bo.mps_fallback", 3.0),),
     r"The operator '?(?P<op>[^'\s]{1,120}?)'? is not current", r"for the (?P<backend>MPS) device",
     r"[`'\"](?P<op>\w{1,40}::[\w.]{1,80})[`'\"] (?:is )?not current", confidence=0.95,
     alternatives=(("unsupported_dtype_on_device", 0.3, "MPS lacks some kernels only for some dtypes"),))
_sig("backend.xformers", "backend_op_missing", "xformers has no kernel for these inputs",
     ("No operator found for `memory_efficient_attention", "No operator found for memory_efficient_attention",
      "is not supported because:"),
     "xformers found no attention kernel for {op} with these inputs[ ({dtype})][ on {devices}].",
     (("bo.xformers_no_kernel", 3.0),),
     r"No operator found for `?(?P<op>\w{1,60})`?", r"\(torch\.(?P<dtype>\w{1,20})\)", follow=24,
     alternatives=(("unsupported_dtype_on_device", 0.35, "xformers kernels need float16/bfloat16 (and bf16 a recent "
                    "GPU)"), _NA_ALT))
_sig("backend.extension_build", "backend_op_missing", "A compiled extension does not match this torch",
     ("can't load C++/CUDA extensions", "built for PyTorch", "was compiled without GPU support",
      "flash_attn_2_cuda", "undefined symbol"),
     "A compiled extension (xformers, flash-attn, bitsandbytes, a custom op) was built for another torch or CUDA "
     "than the one installed[ (built for {built}, you have {have})].",
     (("bo.extension_mismatch", 3.0),),
     r"built for:? ?PyTorch (?P<built>[\w.+]{1,30})(?: with CUDA \d{1,5})?,? ?\(you have (?P<have>[\w.+]{1,30})",
     r"(?P<lib>xformers|flash_attn\w{0,20}|bitsandbytes|_C)(?:[\w./]{0,60})?\.so: undefined symbol",
     r"(?P<lib>[\w-]{1,60})\.so[\w.]{0,10}: undefined symbol: _ZN(?:3c10|2at|5torch)",
     r"(?P<lib>bitsandbytes) was compiled without GPU support", r"(?P<lib>xFormers) can't load",
     require_pattern=True, follow=2, confidence=0.85, alternatives=(_NA_ALT,))
_sig("backend.op_not_exist", "backend_op_missing", "A compiled extension operator is missing",
     ("does not exist",),
     "The operator {op} is not registered: the extension's compiled library did not load for this torch.",
     (("bo.torchvision_mismatch", 3.0),),
     r"operator (?P<op>\w{1,40}::\w{1,60}) does not exist", require_pattern=True, alternatives=(_NA_ALT,))

# --- no accelerator ------------------------------------------------------------------------------------------
_sig("no_accel.not_compiled", "no_accelerator", "This PyTorch has no CUDA",
     ("not compiled with cuda", "torch not compiled with"),
     "Code asked for {backend_name}, but the installed PyTorch was built without {backend_name} support.",
     (("na.cpu_build", 2.0), ("na.hardcoded_cuda", 1.8)), r"not compiled with (?P<backend>\w{1,10}) enabled",
     confidence=0.95, alternatives=(("backend_op_missing", 0.2, "a library calls CUDA-only code paths"),
                                    ("deserialize_device", 0.15, "loading a GPU checkpoint without map_location")))
_sig("no_accel.no_driver", "no_accelerator", "No usable NVIDIA GPU or driver",
     ("Found no NVIDIA driver on your system", "No CUDA GPUs are available", "NVIDIA driver on your system is too old",
      "CUDA driver initialization failed"),
     "Code asked for CUDA, but no NVIDIA driver / GPU is usable in this process.",
     (("na.no_driver", 2.0), ("na.hardcoded_cuda", 1.8)), confidence=0.9,
     alternatives=(("deserialize_device", 0.2, "a GPU checkpoint loaded on a machine without a usable GPU"),))
_sig("no_accel.ordinal", "no_accelerator", "A GPU index that does not exist",
     ("invalid device ordinal",),
     "Code asked for a GPU index this process does not have.",
     (("na.ordinal", 3.0),), confidence=0.9,
     alternatives=(("device_mismatch", 0.3, "a tensor or module placed on a GPU index other processes use"),))
_sig("no_accel.arch", "no_accelerator", "This PyTorch has no kernels for this GPU",
     ("no kernel image is available for execution on the device", "device kernel image is invalid"),
     "The GPU is there, but the installed PyTorch (or an extension) was not compiled for its architecture.",
     (("na.arch_not_in_build", 3.0),), confidence=0.9, alternatives=(_BO_ALT,))
_sig("no_accel.not_linked", "no_accelerator", "This PyTorch has no support for that device type",
     ("is not linked with support for",),
     "Code used tensors on a device[ ('{backend}')] that this PyTorch build has no backend for.",
     (("na.not_linked", 3.0),),
     r"not linked with support for (?P<backend>\w{1,20}) devices", confidence=0.9, alternatives=(_BO_ALT,))
_sig("no_accel.backend_absent", "no_accelerator", "The device backend is not available in this build",
     ("not built with MPS enabled", "MPS backend is supported on MacOS", "has no attribute 'xpu'",
      "Cannot access accelerator device when none is available"),
     "Code asked for a device backend this PyTorch install does not provide.",
     (("na.not_linked", 3.0),), confidence=0.85, alternatives=(_BO_ALT,))

_sig("dtype.half_overflow", "dtype_mismatch", "A value does not fit in float16",
     ("cannot be converted to type at::Half without overflow",),
     "A Python number (a mask value such as -1e10, float(2**30) or torch.finfo(torch.float32).min) was written "
     "into a float16 tensor, whose range ends at 65504.",
     (("dt.half_overflow", 3.0),), confidence=0.9,
     alternatives=(("unsupported_dtype_on_device", 0.3, "a GPU without bfloat16 forces float16 here"),))
_sig("dtype.mps_broadcast", "dtype_mismatch", "Two dtypes met in one MPS graph operation",
     ("are not broadcast compatible",),
     "An operation on mps got a {a} and a {b} tensor; MPS graphs do not mix dtypes.",
     (("dt.operand_cast", 2.0), ("dt.input_not_cast", 1.5)),
     r"tensor<[\dx]{0,40}x?(?P<a>[fi]\d{1,2})> *'? and '?tensor<[\dx]{0,40}x?(?P<b>[fi]\d{1,2})>",
     require_pattern=True)
