"""Issue 41 point 7, twelfth session's hunt (E2): MPS's float8 refusal in its short wording."""

from __future__ import annotations

import json

import pytest

from torchdoctor import explain

SHORT = "RuntimeError: MPS does not support float8_e4m3fn"


@pytest.mark.parametrize("text", [
    SHORT,
    "> " + SHORT,  # quoted in an issue
    "    " + SHORT + "\n",  # indented in a log
    json.dumps({"error": SHORT + "\n"}),  # inside a JSON record
    "\x1b[31m" + SHORT + "\x1b[0m",  # coloured
    "2025-05-28T10:00:01 - ERROR - " + SHORT,  # a logger's line
    "RuntimeError: MPS backend does not support Float8_e4m3fn dtype",
])
def test_mps_float8_short_wording_is_the_float8_answer(text: str) -> None:
    found = explain(text)
    assert found, text
    d = found[0]
    assert (d.signature, d.category) == ("unsupported.mps_fp8", "unsupported_dtype_on_device")
    assert "A float8_e4m3fn tensor" in d.what_happened
    assert "no float8 type on any macOS" in d.what_happened


def test_another_backend_without_float8_is_not_read_as_mps() -> None:
    found = explain("RuntimeError: this GPU does not support float8_e4m3fn")
    assert all(d.signature != "unsupported.mps_fp8" for d in found)


NUMPY_BF16 = "TypeError: Got unsupported ScalarType BFloat16"
XPU_FP64 = "RuntimeError: Required aspect fp64 is not supported on the device"


def _quotings(message: str) -> list[str]:
    return [message, f"`{message}`", json.dumps({"error": message}), message.replace("'", "&#39;") + "<br>",
            "!!! Exception during processing !!! " + message.split(": ", 1)[1] + "\nTraceback (most recent call "
            'last):\n  File "/ComfyUI/execution.py", line 496, in execute\n' + message + "\n"]


@pytest.mark.parametrize("text", _quotings(NUMPY_BF16))
def test_numpy_has_no_bfloat16(text: str) -> None:  # hunt E3 (sdnext#4396, ComfyUI-VideoHelperSuite#685, ...)
    found = explain(text)
    assert found, text
    d = found[0]
    assert (d.signature, d.category) == ("unsupported.numpy_dtype", "unsupported_dtype_on_device")
    assert d.what_happened == "A bfloat16 tensor was converted to numpy, which has no such type."
    assert d.likely_causes[0].startswith("numpy has no bfloat16 type")
    # the cast before numpy comes first, also in a ComfyUI log (its precision flags are not the answer)
    assert d.fixes[0] == ("Cast to float32 before converting", "arr = t.detach().float().cpu().numpy()")
    assert all("--force-fp32" not in code for _, code in d.fixes)


def test_numpy_refusal_names_float8_too() -> None:
    d = explain("TypeError: Got unsupported ScalarType Float8_e4m3fn")[0]
    assert d.signature == "unsupported.numpy_dtype"
    assert d.what_happened.startswith("A float8_e4m3fn tensor was converted to numpy")


@pytest.mark.parametrize("text", _quotings(XPU_FP64))
def test_intel_gpu_without_float64(text: str) -> None:  # hunt E4 (ComfyUI-WanVideoWrapper#711, torch-xpu-ops)
    found = explain(text)
    assert found, text
    d = found[0]
    assert (d.signature, d.category) == ("unsupported.xpu_fp64", "unsupported_dtype_on_device")
    assert "no float64 kernels" in d.likely_causes[0]
    assert d.fixes[0] == ("Make that tensor float32 before it reaches xpu", "t = t.to(torch.float32)")


@pytest.mark.parametrize("text", [
    XPU_FP64,
    "NotImplementedError: The operator 'aten::_int_mm' is not currently implemented for the MPS device. If you want "
    "this op to be added in priority during the prototype phase of this feature, please comment on "
    "https://github.com/pytorch/pytorch/issues/77764.",
])
def test_confirmation_is_not_a_virtual_run_that_answers_ok(text: str) -> None:
    # hunt N13/N15: a virtual xpu computes float64 and a virtual mps ran torch._int_mm, both answering "ok", so
    # explain confirms these on the device itself
    d = explain(text)[0]
    assert d.confirm_with == "with torchdoctor.guard(model):\n    model(*inputs)"
