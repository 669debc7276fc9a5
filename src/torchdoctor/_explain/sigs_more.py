"""Signatures, causes and rules for texts that name their placement problem indirectly, each seen in public reports:

- a CPU-only convolution kernel (``slow_conv3d_forward``, ``_slow_conv2d_forward``, ``thnn_conv2d``) reached with
  GPU or XPU tensors. torch picks a convolution's kernel by its *input*'s device, so a CPU input and GPU weights
  land in the CPU kernel, and the dispatcher then refuses the GPU weight ("Could not run ... with arguments from the
  'CUDA' backend", or on XPU "... is not currently implemented for the XPU device") before any device check. The
  text reads like a missing kernel; the cause is an input left on the CPU. MPS is left out: torch before 2.1 had no
  MPS conv3d, so there the same text is a missing kernel.
- an op XPU has no kernel for (the MPS wording's twin);
- Transformer Engine's ``Data types for parameters must match when outside of autocasted region``: an input and a
  layer's weight in two dtypes;
- ``torch.utils.checkpoint``'s ``CheckpointError`` whose saved and recomputed metadata differ in dtype or device: a
  tensor made in the checkpointed block took its dtype or device from a global setting (``set_default_dtype``,
  ``set_default_device``, a ``with torch.device`` block, a precision context) that was on during the forward and off
  when backward recomputed the block.
"""

from __future__ import annotations

from torchdoctor._explain.causes import ContextRule, register_rule
from torchdoctor._explain.causes import define_cause as _c
from torchdoctor._explain.signatures import define as _sig

__all__: list[str] = []

_DEV, _DT, _IW = "device_mismatch", "dtype_mismatch", "input_weight_type_mismatch"
_BO, _NA = "backend_op_missing", "no_accelerator"

# --- a CPU-only conv kernel reached with accelerator tensors ---------------------------------------------------
_CPU_CONV = ("slow_conv3d_forward", "_slow_conv2d_forward", "'slow_conv2d_forward", "thnn_conv2d", "`slow_conv3d",
             "'slow_conv3d'", "::slow_conv3d'")
_c("dev.conv_input_on_cpu",
   "The convolution's input is on the CPU while its weights are on the accelerator[ ({backend_name})]: torch chose the "
   "CPU kernel[ {op}] from the input's device, and that kernel cannot take the accelerator's weights. Nothing is "
   "missing from this torch build.", "torchdoctor.simulate(model, device={tq})",
   ("Move the input to the layer's device before the call", "x = x.to(next(model.parameters()).device)"),
   ("Find which input (or which layer's weights) stayed behind", 'torchdoctor.scan(model, device={tq})'))
register_rule(ContextRule(
    "cpu_conv_kernel", _CPU_CONV, (), (_BO, _NA), _DEV, (("dev.conv_input_on_cpu", 8.0),), ("mps", "quantized_backend"), 9.0,
    "a CPU-only convolution kernel got accelerator tensors: torch picks a conv's kernel by its input's device, so the "
    "input is on the CPU while the layer's weights are on the GPU"))

# --- an op XPU has no kernel for --------------------------------------------------------------------------------
_sig("backend.xpu_not_implemented", _BO, "An operator is not implemented for XPU",
     ("not currently implemented for the xpu device", "not current implemented for the xpu device"),
     "The operator {op} has no XPU kernel in this PyTorch (or was reached through a path that picked a kernel XPU "
     "lacks).",
     (("bo.xpu_fallback", 3.0),),
     r"The operator '?(?P<op>[^'\s]{1,120}?)'? is not current", r"for the (?P<backend>XPU) device",
     r"[`'\"](?P<op>\w{1,40}::[\w.]{1,80})[`'\"] (?:is )?not current", confidence=0.9,
     alternatives=((_DEV, 0.3, "a CPU input into an XPU layer reaches CPU-only kernels that XPU lacks"),))
_c("bo.xpu_fallback",
   "{op} has no XPU kernel in this PyTorch.", "torchdoctor env",
   ("Let unsupported ops fall back to the CPU", "export PYTORCH_ENABLE_XPU_FALLBACK=1"),
   ("Or run that step on the CPU", 'out = fn(x.cpu()).to("xpu")'),
   ("Or update torch: XPU kernels are added with each release", "pip install -U torch --index-url "
    "https://download.pytorch.org/whl/xpu"))

# --- Transformer Engine: input and weight in two dtypes outside autocast ----------------------------------------
_sig("dtype.te_params_match", _IW, "A Transformer Engine layer got an input and weights in two dtypes",
     ("data types for parameters must match when outside of autocasted region",),
     "A Transformer Engine layer got its input in {a} and its {param} in {b}, outside any autocast region, where "
     "it computes only when they agree.",
     (("dt.te_input_not_cast", 3.0), ("dt.input_not_cast", 1.0)),
     r"input dtype: torch\.(?P<a>\w{1,20}) and '?(?P<param>\w{1,20})'? dtype: torch\.(?P<b>\w{1,20})",
     follow=2, confidence=0.9, alternatives=((_DT, 0.7, "two dtypes meet in one op"),))
_c("dt.te_input_not_cast",
   "The layer's {param} is {b} and its input is {a}: the model was cast (or loaded in {b}) and the input was not, "
   "or a tensor the program made in the forward took the default dtype.", "torchdoctor.guard(model)",
   ("Cast the input to the layer's dtype", "x = x.to(torch.{b})"),
   ("Or run the forward under autocast", "with torch.autocast(x.device.type, dtype=torch.{b}):\n    out = model(x)"))

# --- checkpoint recompute with other metadata -------------------------------------------------------------------
_SAVED = r"saved metadata: \{[^}]{0,300}?"
_AGAIN = r"\}\s{0,8}recomputed metadata: \{[^}]{0,300}?"
_sig("dtype.checkpoint_recompute", _DT, "Backward recomputed a checkpointed tensor in another dtype",
     ("recomputed values for the following tensors have different metadata",),
     "Activation checkpointing recomputed a tensor of the block in {b} that the forward had saved in {a}: a tensor "
     "made in the block took its dtype from a setting that was on in the forward and off in backward.",
     (("dt.checkpoint_global_dtype", 3.0),),
     _SAVED + r"'dtype': torch\.(?P<a>\w{1,20})\b[^}]{0,300}?" + _AGAIN + r"'dtype': torch\.(?!(?P=a)\b)(?P<b>\w{1,20})",
     require_pattern=True, follow=8, after=1500, confidence=0.85)
_sig("device.checkpoint_recompute", _DEV, "Backward recomputed a checkpointed tensor on another device",
     ("recomputed values for the following tensors have different metadata",),
     "Activation checkpointing recomputed a tensor of the block on {b} that the forward had saved on {a}: a tensor "
     "made in the block took its device from a setting that was on in the forward and off in backward.",
     (("dev.checkpoint_global_device", 3.0),),
     _SAVED + r"'device': device\(type='(?P<a>\w{1,12})'[^}]{0,300}?" + _AGAIN
     + r"'device': device\(type='(?!(?P=a)')(?P<b>\w{1,12})'",
     require_pattern=True, follow=8, after=1500, confidence=0.85)
_c("dt.checkpoint_global_dtype",
   "A factory call in the checkpointed block (torch.zeros, torch.tensor, torch.arange ... without dtype=) took the "
   "default dtype, which a context set around the forward only (torch.set_default_dtype, a precision plugin's "
   "'true' half mode); backward recomputes the block outside it. Non-reentrant checkpoint restores autocast, not "
   "the default dtype.", "torchdoctor run train.py",
   ("Give the factory the dtype of the data it works with", "aux = torch.zeros((), dtype=x.dtype, device=x.device)"),
   ("Or keep the setting on through backward too", "with precision_context():\n    loss = model(x)\n    "
    "loss.backward()"))
_c("dev.checkpoint_global_device",
   "A factory call in the checkpointed block (torch.zeros, torch.arange ... without device=) took the default "
   "device, which a context set around the forward only (torch.set_default_device, a with torch.device(...) "
   "block); backward recomputes the block outside it.", "torchdoctor run train.py",
   ("Give the factory the device of the data it works with", "mask = torch.ones(n, device=x.device)"),
   ("Or keep the setting on through backward too", "with torch.device(device):\n    loss = model(x)\n    "
    "loss.backward()"))
