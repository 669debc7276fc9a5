"""Signatures read from the stack when the message is missing or cut off (issue 29: frames count as evidence).

People paste the frames and lose the last line, or the message sits on a line of its own elsewhere. These
signatures match frames (or the first words of a cut message) and are *weak*: ``api`` keeps them only when no
full error message was recognised in the same text, and their diagnosis says it came from the stack.
"""

from __future__ import annotations

from torchdoctor._explain.signatures import define as _sig

__all__ = ["WEAK_PREFIXES"]

WEAK_PREFIXES = ("frames.", "partial.")
_FROM_STACK = "The error message is missing or cut off; the stack alone shows "

_sig("frames.xformers", "backend_op_missing", "From the stack: xformers attention failed (message missing)",
     ("memory_efficient_attention(", "enable_xformers_memory_efficient_attention", "xformers/ops/fmha",
      ", in memory_efficient_attention", "xformers.ops.memory_efficient_attention"),
     _FROM_STACK + "an xformers memory_efficient_attention call; it fails when this xformers has no kernel for "
     "the inputs' device, dtype or GPU (built for another torch/CUDA, CPU inputs, an old GPU).",
     (("bo.xformers_build", 2.0), ("bo.xformers_cpu_inputs", 1.0)), confidence=0.5,
     alternatives=(("unsupported_dtype_on_device", 0.3, "xformers kernels exist only for some dtypes per GPU"),))
_sig("frames.bnb", "quantization_device", "From the stack: a bitsandbytes layer failed (message missing)",
     ("matmul_4bit(", "dequantize_4bit(", "bnb.matmul(", "functional_linear_4bits(", "quant_state=self.weight"),
     _FROM_STACK + "a bitsandbytes 4/8-bit layer at work (quantize / dequantize / matmul_4bit); placement "
     "failures there are a quantized weight or its quant_state on another device than the input.",
     (("q.bnb_state_cpu", 2.0), ("q.bnb_input_cpu", 1.0)), confidence=0.5,
     alternatives=(("device_mismatch", 0.4, "the input itself may be on the other device"),))
_sig("frames.module_to", "mixed_device_model", "From the stack: Module.to() failed (message missing)",
     ("t.to(device, dtype if t.is_floating_point()", "self._apply(convert)", "module._apply(fn)"),
     _FROM_STACK + "Module.to() converting parameters (model.to(device=..., dtype=...)); it fails on tensors "
     "that have no data (meta) or on a dtype the target device lacks (float64 / bfloat16 / float8 on mps).",
     (("md.meta_to", 2.0),), confidence=0.45,
     alternatives=(("unsupported_dtype_on_device", 0.6, "moving to mps fails for float64 / float8 tensors"),))
_sig("frames.stft", "device_mismatch", "From the stack: torch.stft failed (message missing)",
     (", in stft", "torch.stft(", "_vf.stft("),
     _FROM_STACK + "torch.stft; it fails when the window tensor sits on another device than the signal.",
     (("dev.stft_window", 3.0),), confidence=0.45)
_sig("frames.deserialize", "deserialize_device", "From the stack: torch.load restoring GPU storages failed (message "
     "missing)",
     # not "validate_cuda_device": its only key, "_device", is in every other identifier of a log (bench/explain.py)
     ("_cuda_deserialize", "default_restore_location", ", in restore_location"),
     _FROM_STACK + "torch.load restoring storages that were saved on a GPU (torch/serialization.py "
     "restore_location / _cuda_deserialize); it fails where that GPU is not available to this process.",
     (("ds.cpu_only_load", 3.0), ("ds.gpu_invisible", 1.5)), confidence=0.55,
     alternatives=(("no_accelerator", 0.35, "this torch sees no GPU at all: a CPU-only build or a missing driver"),))
_sig("partial.expected_same", "device_mismatch", "Tensors on two devices met in one operation (message cut off)",
     ("error: expected all te",),
     "The message is cut off after 'Expected all te...': PyTorch's 'Expected all tensors to be on the same "
     "device', an operation that got tensors on two devices.",
     (("dev.module_not_moved", 2.0), ("dev.inputs_not_moved", 1.5)), confidence=0.6,
     alternatives=(("quantization_device", 0.4, "a quantized layer's state on another device raises it too"),))
# the words of the meta-tensor family without its message ("a meta tensor error when calling
# enable_sequential_cpu_offload()"): weak like the frames, quiet wherever a full message is recognised
_sig("partial.meta_tensor", "mixed_device_model", "A meta-tensor error (message missing)",
     # keys of rare pass characters ("uses meta tens", "bout meta tens"): a "t" key is read at every "t" of a log
     ("causes meta tensor", "causes a meta tensor", "error about meta tensor"),
     "The message is missing; the text names a meta-tensor error: weights left on the meta device (a model built "
     "empty for a device map or offloading, never filled) were read or moved.",
     (("md.offload_meta", 2.0), ("md.meta_to", 1.5)), confidence=0.45,
     alternatives=(("quantization_device", 0.3, "quantized weights offloaded to meta fail the same way"),))
