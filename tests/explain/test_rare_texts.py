"""Texts from public reports that explain did not recognise, each with a second shape of its family, and a dtype
an op never takes (an integer tensor in lerp, a float mask in bitwise_and): told as that, never as a precision or
device question with `model.float()` or `pip install -U torch`."""

from __future__ import annotations

import pytest

from torchdoctor._explain.api import explain

CASES = [
    # a CPU tensor handed to an NCCL collective (NeMo Automodel, gradient clipping of offloaded gradients)
    ("RuntimeError: No backend type associated with device type cpu", "device_mismatch", "cpu"),
    ("  File \"/opt/conda/lib/python3.11/site-packages/torch/distributed/c10d_logger.py\", line 81, in wrapper\n"
     "    return func(*args, **kwargs)\nRuntimeError: No backend type associated with device type xpu",
     "device_mismatch", "xpu"),
    # MPS graph's own dtype check (pytorch PR 144170: a half input and float weights)
    ("(mpsFileLoc): /AppleInternal/Library/BuildRoots/b11baf73/Library/Caches/com.apple.xbs/Sources/"
     "MetalPerformanceShadersGraph/mpsgraph/MetalPerformanceShadersGraph/Core/Files/MPSGraphUtilities.mm:233:0: "
     "error: 'mps.divide' op requires the same element type for all operands and results", "dtype_mismatch", "divide"),
    ("error: 'mps.matmul' op requires the same element type for all operands and results", "dtype_mismatch",
     "mps.matmul"),
    ("RuntimeError: Cannot access data pointer of Tensor that doesn't have storage", "mixed_device_model", ""),
    ("Pointer argument (at 1) cannot be accessed from Triton (cpu tensor?)", "device_mismatch", "1"),
    ("ValueError: Pointer argument (at 3) cannot be accessed from Triton (cpu tensor?)", "device_mismatch", "3"),
    ("AssertionError: If capturable=False, state_steps should not be CUDA tensors.", "device_mismatch", ""),
    ("RuntimeError: expected dtype Double but got dtype Float", "dtype_mismatch", "float64"),
    ("RuntimeError: expected dtype Float but got dtype Half", "dtype_mismatch", "float16"),
    ("Error occurred when executing KSampler:Query/Key/Value should either all have the same dtype",
     "dtype_mismatch", ""),
    ("RuntimeError: cutlassF: no kernel found to launch!", "unsupported_dtype_on_device", ""),
]


@pytest.mark.parametrize(("text", "category", "said"), CASES)
def test_a_rare_text_is_recognised(text: str, category: str, said: str) -> None:
    found = explain(text)
    assert found and found[0].category == category
    assert said in found[0].what_happened
    assert found[0].fixes[0][1] != "torchdoctor env"  # something to do beyond looking at the environment


PRECISION = ("model = model.float()", "pip install -U torch", "out = op(x.float()).to(x.dtype)")
KINDS = [
    ("NotImplementedError: \"lerp_kernel_scalar\" not implemented for 'Long'", "is_floating_point", "int64"),
    ("RuntimeError: \"lerp_kernel_scalar\" not implemented for `Bool`", "is_floating_point", "bool"),
    ("RuntimeError: \"LayerNormKernelImpl\" not implemented for 'Long'", "x = x.float()", "int64"),
    ("RuntimeError: \"slow_conv2d_cpu\" not implemented for 'Byte'", "x = x.float()", "uint8"),
    ("RuntimeError: \"bitwise_and_cuda\" not implemented for 'Float'", "mask.bool()", "float32"),
    ("RuntimeError: \"bitwise_or_cpu\" not implemented for 'Half'", "mask.bool()", "float16"),
    ("RuntimeError: \"nll_loss_forward_reduce_cuda_kernel_2d_index\" not implemented for 'Float'",
     "target.long()", "float32"),
]


@pytest.mark.parametrize(("text", "fix", "dtype"), KINDS)
def test_a_dtype_the_op_never_takes_is_not_a_precision_question(text: str, fix: str, dtype: str) -> None:
    d = explain(text)[0]
    codes = [code for _, code in d.fixes]
    assert fix in codes[0]
    assert not any(p in codes for p in PRECISION)
    assert dtype in d.likely_causes[0] and "on every device" in d.likely_causes[0]


def test_half_on_the_cpu_is_still_a_precision_question() -> None:
    d = explain("RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'")[0]
    assert d.fixes[0][1] == "model = model.float()"


def test_an_integer_kernel_missing_on_one_device_only_is_not_called_impossible() -> None:
    # abs has int64 kernels on the CPU and CUDA; an old MPS build lacked it (pytorch issue 80784)
    d = explain("NotImplementedError: \"abs_out_mps\" not implemented for 'Long'")[0]
    assert "on every device" not in " ".join(d.likely_causes)


@pytest.mark.parametrize("text", [
    # torch before 2.4 and after: autocast("cuda") on a machine without CUDA (an XPU, a Mac, the CPU)
    "UserWarning: User provided device_type of 'cuda', but CUDA is not available. Disabling",
    "/home/u/train.py:10: UserWarning: CUDA is not available or torch_xla is imported. Disabling autocast.\n"
    "  with torch.autocast(\"cuda\", dtype=torch.bfloat16):",
])
def test_autocast_switched_off_for_a_missing_cuda_is_told_with_the_device_s_own_autocast(text: str) -> None:
    d = explain(text)[0]
    assert d.category == "no_accelerator" and "float32" in d.what_happened
    assert "device_type=x.device.type" in d.fixes[0][1]


def test_autocast_switched_off_for_a_dtype_is_told_with_a_dtype_the_device_has() -> None:
    d = explain("UserWarning: In CPU autocast, but the target dtype is not supported. Disabling autocast.\n"
                "CPU Autocast only supports dtypes of torch.bfloat16, torch.float16 currently.")[0]
    assert d.category == "unsupported_dtype_on_device" and "torch.bfloat16, torch.float16" in d.what_happened
    assert "dtype=torch.bfloat16" in d.fixes[0][1]
