"""Fixes that do not walk into the next error: a float8 tensor at a kernel is upcast and kept (casting the result
back to float8 fails the next op the same way), and a dtype mismatch read from its text alone offers both
directions (the text cannot tell which side is odd: a VAE kept in float32 on purpose is met the other way)."""

from __future__ import annotations

import pytest

from torchdoctor import explain


@pytest.mark.parametrize("text", [
    "NotImplementedError: \"mul_cuda\" not implemented for 'Float8_e4m3fn'",  # ComfyUI's fp8 elementwise op
    "Exception during fp8 op: \"clamp_scalar_cuda\" not implemented for 'Float8_e4m3fn'\n"
    "!!! Exception during processing !!! \"addmm_cuda\" not implemented for 'Float8_e4m3fn'",
    "RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Float8_e4m3fn'",
])
def test_a_float8_kernel_error_upcasts_and_keeps_the_result(text: str) -> None:
    d = explain(text)[0]
    assert d.category == "unsupported_dtype_on_device"
    assert d.likely_causes[0].startswith("float8_e4m3fn is a storage dtype")
    codes = [code for _, code in d.fixes]
    assert codes[0].startswith("x = x.to(torch.bfloat16)  # then run the op; do not cast the result back")
    assert "model.to(torch.bfloat16)" in codes
    assert not any(".to(x.dtype)" in code for code in codes)  # the round trip back to float8
    if "_cuda" in text:  # a CUDA kernel is no sign of a CPU-only torch
        assert not any("the GPU was not used" in c for c in d.likely_causes)


def test_a_float8_kernel_error_keeps_the_input_dtype_when_the_text_names_one() -> None:
    d = explain("RuntimeError: \"mul_cuda\" not implemented for 'Float8_e4m3fn' (input float16)")[0]
    assert d.fixes[0][1].startswith("x = x.to(torch.float16)")


def test_a_half_kernel_error_on_the_cpu_is_unchanged() -> None:
    d = explain("RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'")[0]
    assert d.fixes[0] == ("Use float32 on the CPU", "model = model.float()")


def test_a_scalar_type_mismatch_offers_both_directions() -> None:
    d = explain("RuntimeError: expected scalar type Half but found Float")[0]  # diffusers' VAE kept in float32
    codes = [code for _, code in d.fixes]
    assert codes[:2] == ["t = t.half()  # t: the operand that is float32",
                         "x = x.float()  # x: the operand that is float16"]
    assert "kept in float32 on purpose (a VAE or a norm upcast)" in d.fixes[1][0]


def test_a_meta_read_under_offload_reads_the_weight_inside_its_module() -> None:
    """A parent's forward reading an offloaded child's parameter (diffusers' sequential offload: only the child's
    own forward gets its weights from accelerate's hook) is told to read it there or offload the model whole, not
    to materialise the model and load a state dict it does not have."""
    text = ('Traceback (most recent call last):\n  File "/work/app.py", line 12, in forward\n'
            '    a = s.gate.alpha.item()\n'
            '  File "/usr/lib/python3.11/site-packages/accelerate/hooks.py", line 170, in new_forward\n'
            'RuntimeError: Tensor.item() cannot be called on meta tensors')
    d = explain(text)[0]
    assert d.category == "mixed_device_model"
    assert d.fixes[:2] == (("See which modules were offloaded", "print(model.hf_device_map)"),
                           ("Read an offloaded module's weights only inside its own forward (its hook loads them "
                            "there), or offload the whole model as one unit",
                            "cpu_offload(model, execution_device=device)  # not each child on its own"))
    assert not any("to_empty" in code for _, code in d.fixes[:3])
