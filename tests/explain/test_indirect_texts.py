"""Texts that name their placement problem indirectly (public reports, 2025-26): a CPU-only conv kernel reached with
accelerator tensors (the input left on the CPU, told as a missing kernel by torch), an op XPU lacks, Transformer
Engine's dtype check, and a checkpointed block recomputed in another dtype or device. The checkpoint text is made
here by torch itself."""

from __future__ import annotations

import html
import json

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from torchdoctor._explain.api import explain

_XPU_CONV = ("NotImplementedError: The operator 'aten::_slow_conv2d_forward' is not currently implemented for the XPU "
             "device. Please open a feature on https://github.com/intel/torch-xpu-ops/issues. You can set the "
             "environment variable `PYTORCH_ENABLE_XPU_FALLBACK=1` to use the CPU implementation as a fallback for "
             "XPU unimplemented operators. WARNING: this will bring unexpected performance compared with running "
             "natively on XPU.")
_CUDA_CONV3D = ("!!! Exception during processing !!! Could not run 'aten::slow_conv3d_forward' with arguments from "
                "the 'CUDA' backend. This could be because the operator doesn't exist for this backend, or was "
                "omitted during the selective/custom build process (if using custom build). "
                "'aten::slow_conv3d_forward' is only available for these backends: [CPU, Meta, BackendSelect, "
                "Python, Named, Conjugate].")


@pytest.mark.parametrize("text", [_XPU_CONV, html.escape(_XPU_CONV, quote=True), _CUDA_CONV3D,
                                  json.dumps({"error": _CUDA_CONV3D})])
def test_a_cpu_only_conv_kernel_with_accelerator_tensors_is_an_input_left_on_the_cpu(text: str) -> None:
    found = explain(text)
    assert found[0].category == "device_mismatch"
    assert "input is on the CPU while its weights are on the accelerator" in found[0].likely_causes[0]
    assert "Nothing is missing from this torch build" in found[0].likely_causes[0]
    # an app's own switch comes first where the text is an app's (ComfyUI's prefix); the code fix is always there
    assert ("Move the input to the layer's device before the call", "x = x.to(next(model.parameters()).device)") \
        in found[0].fixes
    assert all("pip install" not in code for _, code in found[0].fixes)  # no new torch for a misplaced input
    assert "backend_op_missing" in {a.category for a in found[0].alternatives}


def test_the_same_kernel_on_mps_and_an_op_xpu_lacks_stay_missing_kernels() -> None:
    # torch before 2.1 had no MPS conv3d: there the CPU kernel is reached with every operand on MPS
    mps = explain("NotImplementedError: Could not run 'aten::slow_conv3d_forward' with arguments from the 'MPS' "
                  "backend. 'aten::slow_conv3d_forward' is only available for these backends: [CPU, Meta].")
    assert mps[0].category != "device_mismatch"
    xpu = explain("RuntimeError: The operator 'aten::slow_conv_transpose3d' is not currently implemented for the XPU "
                  "device. Please open a feature on https://github.com/intel/torch-xpu-ops/issues.")
    assert xpu[0].category == "backend_op_missing"
    assert "aten::slow_conv_transpose3d has no XPU kernel" in xpu[0].what_happened
    assert ("Let unsupported ops fall back to the CPU", "export PYTORCH_ENABLE_XPU_FALLBACK=1") in xpu[0].fixes


def test_transformer_engine_dtype_check() -> None:
    found = explain("TypeError: Data types for parameters must match when outside of autocasted region.\n"
                    "Found input dtype: torch.float32 and 'weight' dtype: torch.bfloat16")
    assert found[0].category == "input_weight_type_mismatch"
    assert "input in float32 and its weight in bfloat16" in found[0].what_happened
    assert found[0].fixes[0][1] == "x = x.to(torch.bfloat16)"


def _checkpoint_error_text() -> str:
    lin = torch.nn.Linear(4, 4).to(torch.bfloat16)

    def block(x: torch.Tensor) -> torch.Tensor:
        aux = torch.zeros(())  # the default dtype: bfloat16 in the forward, float32 when backward recomputes
        return (lin(x) * (aux + 1)).sum()

    x = torch.randn(2, 4, dtype=torch.bfloat16, requires_grad=True)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        loss = checkpoint(block, x, use_reentrant=False)
    finally:
        torch.set_default_dtype(old)
    with pytest.raises(Exception) as err:
        loss.backward()
    return f"{type(err.value).__module__}.{type(err.value).__name__}: {err.value}"


def test_a_checkpointed_block_recomputed_in_another_dtype_by_torch_itself() -> None:
    found = explain(_checkpoint_error_text())
    assert len(found) == 1 and found[0].category == "dtype_mismatch"
    assert "recomputed a tensor of the block in float32 that the forward had saved in bfloat16" in \
        found[0].what_happened
    assert "took the default dtype" in found[0].likely_causes[0]
    assert found[0].fixes[0][1] == "aux = torch.zeros((), dtype=x.dtype, device=x.device)"


def test_a_checkpointed_block_recomputed_on_another_device() -> None:
    text = ("torch.utils.checkpoint.CheckpointError: torch.utils.checkpoint: Recomputed values for the following "
            "tensors have different metadata than during the forward pass.\ntensor at position 3:\nsaved metadata: "
            "{'shape': torch.Size([4]), 'dtype': torch.float32, 'device': device(type='cuda', index=0)}\n"
            "recomputed metadata: {'shape': torch.Size([4]), 'dtype': torch.float32, 'device': device(type='cpu')}")
    found = explain(text)
    assert len(found) == 1 and found[0].category == "device_mismatch"  # the same dtype on both sides: no dtype story
    assert "on cpu that the forward had saved on cuda" in found[0].what_happened
    assert "took the default device" in found[0].likely_causes[0]
