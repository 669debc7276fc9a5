"""Issue 41 point 7: three misses of a black-box hunt on rebuilt public reports.

1. bitsandbytes asked to quantize a 4-bit weight that is already packed (bitsandbytes#1664, #1525, diffusers#10800,
   accelerate#3566): "Blockwise quantization only supports 16/32-bit floats, but got torch.uint8".
2. torchdoctor's own PlacementError / PlacementWarning text, logged by an app that caught it.
3. A layer input and weights in two dtypes, where the text says which is which: the fix casts the odd one out, to
   the dtype the text gives the other side, never a tensor to the dtype it already has.
"""

from __future__ import annotations

import re

import pytest

from torchdoctor._explain.api import Diagnosis, explain


def fixes(d: Diagnosis) -> str:
    return "\n".join(f"{t}\n{c}" for t, c in d.fixes)


def first_code(d: Diagnosis) -> str:
    return d.fixes[0][1]


# --- 3: the odd side of a layer ---------------------------------------------------------------------------------
# (text, category, the first fix's code starts with, a cast no fix may print: the side's own dtype)
SIDES = [
    ("RuntimeError: Input type (c10::BFloat16) and bias type (float) should be the same",
     "input_weight_type_mismatch", "layer.to(torch.bfloat16)", "x.to(next(model.parameters()).dtype)"),
    ("RuntimeError: Input type (CUDABFloat16Type) and weight type (torch.cuda.FloatTensor) should be the same",
     "input_weight_type_mismatch", "layer.to(torch.bfloat16)", "x.to(next(model.parameters()).dtype)"),
    ("RuntimeError: Input type (XPUBFloat16Type) and weight type (XPUFloatType) should be the same",
     "input_weight_type_mismatch", "layer.to(torch.bfloat16)", "x.to(torch.bfloat16)"),
    ("RuntimeError: Input type (MPSHalfType) and bias type (MPSFloatType) should be the same",
     "input_weight_type_mismatch", "layer.to(torch.float16)", "x.to(torch.float16)"),
    ("RuntimeError: Input type (c10::Half) and weight type (c10::BFloat16) should be the same",
     "input_weight_type_mismatch", "layer.to(torch.float16)", "x.to(torch.float16)"),
    ("RuntimeError: Input type (float) and bias type (c10::Half) should be the same",
     "dtype_mismatch", "x = x.to(torch.float16)", "layer.to(torch.float16)"),
    ("RuntimeError: Input type (MPSFloatType) and weight type (MPSHalfType) should be the same",
     "dtype_mismatch", "x = x.to(torch.float16)", "x.to(torch.float32)"),
    ("RuntimeError: Input type (torch.cuda.ByteTensor) and weight type (torch.cuda.HalfTensor) should be the same",
     "dtype_mismatch", "x = x.to(torch.float16)", "x.to(torch.uint8)"),
    ("RuntimeError: mat1 and mat2 must have the same dtype, but got BFloat16 and Float",
     "dtype_mismatch", "layer.to(torch.bfloat16)", "x.to(next(model.parameters()).dtype)"),
    ("RuntimeError: expected mat1 and mat2 to have the same dtype, but got: c10::BFloat16 != float",
     "dtype_mismatch", "layer.to(torch.bfloat16)", "x.to(next(model.parameters()).dtype)"),
    ("RuntimeError: self and mat2 must have the same dtype, but got Half and Float",
     "dtype_mismatch", "layer.to(torch.float16)", "x.to(next(model.parameters()).dtype)"),
    ("RuntimeError: expected m1 and m2 to have the same dtype, but got: float != c10::Half",
     "dtype_mismatch", "x = x.to(torch.float16)", "layer.to(torch.float16)"),
]


@pytest.mark.parametrize("text,category,first,never", SIDES, ids=[s[0][14:60] for s in SIDES])
def test_the_odd_side_is_cast(text: str, category: str, first: str, never: str) -> None:
    d = explain(text)[0]
    assert d.category == category, d
    assert first_code(d).startswith(first), d.fixes
    assert never not in fixes(d), d.fixes


def test_the_fix_names_both_dtypes_as_the_text_gives_them() -> None:
    d = explain("RuntimeError: Input type (c10::BFloat16) and bias type (float) should be the same")[0]
    title, code = d.fixes[0]
    assert "bfloat16" in title and "its bias is float32" in title
    assert "bias is float32" in code and "already bfloat16" in code
    assert "stayed float32" in d.likely_causes[0]
    # autocast is offered only in a reduced dtype (torch.autocast refuses float32 on CUDA)
    wide = explain("RuntimeError: Input type (float) and weight type (double) should be the same")[0]
    assert first_code(wide).startswith("layer.to(torch.float32)")
    assert "autocast" not in fixes(wide)


def test_scalar_type_casts_the_found_operand_to_the_expected_dtype() -> None:
    for text, cast, odd in (("RuntimeError: expected scalar type Float but found BFloat16", ".float()", "bfloat16"),
                            ("RuntimeError: expected scalar type BFloat16 but found Float", ".bfloat16()", "float32"),
                            ("RuntimeError: expected scalar type Half but found Float", ".half()", "float32")):
        d = explain(text)[0]
        assert d.category == "dtype_mismatch"
        assert first_code(d) == f"t = t{cast}  # t: the operand that is {odd}", d.fixes


@pytest.mark.parametrize("text", [
    "RuntimeError: Input type (float) and weight type (unsigned char) should be the same",
    "RuntimeError: Input type (torch.cuda.FloatTensor) and weight type (torch.cuda.ByteTensor) should be the same",
    "RuntimeError: mat1 and mat2 must have the same dtype, but got Float and Byte",
])
def test_integer_weights_are_storage_never_a_cast_target(text: str) -> None:
    d = explain(text)[0]
    assert d.category == "dtype_mismatch"
    assert "storage dtype" in d.likely_causes[0]
    assert "dequantize" in fixes(d) and not re.search(r"\.to\(torch\.u?int8\)|\.byte\(\)", fixes(d)), d.fixes


def test_a_vae_and_peft_still_name_their_own_cause() -> None:
    vae = explain('  File "/x/diffusers/models/autoencoders/autoencoder_kl.py", line 304, in decode\n'
                  "RuntimeError: Input type (c10::BFloat16) and bias type (c10::Half) should be the same")[0]
    assert "VAE" in vae.likely_causes[0]
    peft = explain('  File "/x/peft/tuners/lora/layer.py", line 500, in forward\n'
                   "RuntimeError: mat1 and mat2 must have the same dtype, but got BFloat16 and Float")[0]
    assert "LoRA" in peft.likely_causes[0]
    assert "x.to(next(model.parameters()).dtype)" not in fixes(peft)


# --- 1: bitsandbytes quantizing packed weights again ---------------------------------------------------------
E10 = ('  File "/ceph-ssd/bnb_fix/.venv/lib/python3.13/site-packages/bitsandbytes/nn/modules.py", line 343, in to\n'
       "    return self._quantize(device)\n"
       '  File "/ceph-ssd/bnb_fix/.venv/lib/python3.13/site-packages/bitsandbytes/nn/modules.py", line 302, in _quantize\n'
       "    w_4bit, quant_state = bnb.functional.quantize_4bit(\n"
       "RuntimeError: Blockwise quantization only supports 16/32-bit floats, but got torch.uint8")
PACKED = [
    E10,
    "ValueError: Blockwise quantization only supports 16/32-bit floats, but got torch.uint8",
    "ValueError: Blockwise 4bit quantization only supports 16/32-bit floats, but got torch.uint8",
    "!!! ERROR during execution: Blockwise quantization only supports 16/32-bit floats, but got torch.uint8",
    "ValueError: Blockwise quantization only supports 16/32-bit floats, but got `torch.uint8`",
    "ValueError: Blockwise quantization only supports 16/32-bit floats, but got 'torch.uint8'",
    '{"detail": "ValueError: Blockwise quantization only supports 16/32-bit floats, but got \\"torch.uint8\\""}',
    "ValueError: Blockwise quantization only supports 16/32-bit floats, but got &#39;torch.uint8&#39;",
]


@pytest.mark.parametrize("text", PACKED, ids=range(len(PACKED)))
def test_packed_weights_quantized_again(text: str) -> None:
    found = explain(text)
    assert found, text
    d = found[0]
    assert (d.category, d.signature) == ("quantization_device", "quant.bnb_requantize")
    assert "got a uint8 tensor" in d.what_happened
    assert "already quantized" in d.likely_causes[0] and "quantized again" in d.likely_causes[0]
    assert d.fixes[0][1].startswith("pip install -U bitsandbytes")
    assert any("Params4bit(layer.weight)" in c for _, c in d.fixes)


def test_offloading_names_the_offload_fix() -> None:
    d = explain('  File "/x/diffusers/pipelines/pipeline_utils.py", line 1190, in enable_sequential_cpu_offload\n'
                "ValueError: Blockwise quantization only supports 16/32-bit floats, but got torch.uint8")[0]
    assert "CPU offloading" in d.likely_causes[0]
    assert d.fixes[0][1].startswith("pipe.enable_model_cpu_offload()")


def test_a_float_dtype_is_not_called_packed() -> None:
    d = explain("ValueError: Blockwise quantization only supports 16/32-bit floats, but got torch.bfloat16")[0]
    assert d.category == "quantization_device"
    assert "cannot quantize bfloat16" in d.likely_causes[0] and "packed" not in " ".join(d.likely_causes)
    assert d.fixes[0][1] == "pip install -U bitsandbytes"


def test_prose_about_it_is_not_the_error() -> None:
    assert not explain("bitsandbytes only supports 16/32-bit floats in this release, as far as I know")


# --- 2: torchdoctor's own reports, caught and logged -------------------------------------------------------------
E16 = ("ERROR:root:!!! Exception during processing !!! dtype problem in `patch` (Conv2d) at aten.convolution.default: "
       "arg 2 (bias) is float32, expected bfloat16 like arg 0 (input)\n"
       "  culprit patch.bias = arg 2 (bias): f32[8]@cpu  (expected bfloat16)\n")


def test_a_logged_placement_error_is_our_own_problem() -> None:
    report = explain(E16)
    assert report, "our own headline fell through to 'no known error'"
    d = report[0]
    assert (d.category, d.signature) == ("dtype_mismatch", "own.dtype")
    assert "`patch.bias` is float32, expected bfloat16" in d.what_happened and "`patch`" in d.what_happened
    assert d.fixes[0][1] == "model.patch.bias.data = model.patch.bias.data.to(torch.bfloat16)"
    assert len(d.likely_causes) == 1  # the culprit is named: no ComfyUI node guess beside it
    assert not any("--force-fp32" in c for _, c in d.fixes)


def test_the_headline_alone_names_the_layer_parameter() -> None:
    d = explain(E16.split("\n")[0])[0]
    assert d.signature == "own.dtype" and "`patch.bias` is float32" in d.what_happened
    assert d.fixes[0][1] == "model.patch.bias.data = model.patch.bias.data.to(torch.bfloat16)"


def test_the_printed_fix_and_its_proof_are_reported(tmp_path: object) -> None:
    import torch

    import torchdoctor

    class Tower(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.patch = torch.nn.Conv2d(3, 4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.patch(x)

    m = Tower().to(torch.bfloat16)
    m.patch.bias.data = m.patch.bias.data.float()
    with pytest.raises(torchdoctor.PlacementError) as info:
        with torchdoctor.guard(m):
            m(torch.rand(1, 3, 4, 4, dtype=torch.bfloat16))
    err = info.value
    for text in (f"ERROR:root:!!! Exception during processing !!! {err}",
                 f"Traceback (most recent call last):\n  File \"app.py\", line 3, in <module>\n"
                 f"torchdoctor.PlacementError: {err}"):
        d = explain(text)[0]
        assert d.signature == "own.dtype", text
        assert d.fixes[0][1] == err.fix == "model.patch.bias.data = model.patch.bias.data.to(torch.bfloat16)"
        assert d.fixes[0][0].startswith("The fix torchdoctor printed with the report")
    with pytest.warns(torchdoctor.PlacementWarning) as record:
        with torchdoctor.guard(m, mode="warn"):
            m(torch.rand(1, 3, 4, 4, dtype=torch.bfloat16))
    logged = f"/app/node.py:12: PlacementWarning: {record[0].message}"
    d = explain(logged)[0]
    assert d.signature == "own.dtype" and "`patch.bias` is float32, expected bfloat16" in d.what_happened
    assert d.fixes[0][1] == "model.patch.bias.data = model.patch.bias.data.to(torch.bfloat16)"
    assert d.fixes[0][0] == "The fix torchdoctor printed with the report (proven)"


def test_a_device_report_and_a_virtual_run() -> None:
    virtual = ("torchdoctor.PlacementError: 1 placement problem(s) on virtual cuda:0, first in <root> (M):\n"
               "  device t f32[4]@cpu is on cpu when <root> (M) starts on cuda:0: a plain tensor attribute the "
               "forward reads (Module.to moves parameters and buffers only)\n"
               "Fix:\n    model.t.data = model.t.data.to('cuda:0')\n")
    d = explain(virtual)[0]
    assert (d.category, d.signature) == ("device_mismatch", "own.device")
    assert "`t` is on cpu, expected cuda:0" in d.what_happened
    assert d.fixes[0][1] == "model.t.data = model.t.data.to('cuda:0')"
    caused = ("torchdoctor.PlacementError: device mismatch caused by `encoder.pos` (cpu, expected cuda:0); it "
              "surfaced in `encoder.attn` (Linear) during forward: cpu where cuda:0 was expected\n"
              "  culprit encoder.pos: f32[16]@cpu  is cpu, expected cuda:0\n")
    d = explain(caused)[0]
    assert d.signature == "own.device" and "read by `encoder.attn`" in d.what_happened
    assert d.fixes[0][1] == "model.encoder.pos.data = model.encoder.pos.data.to('cuda:0')"


def test_prose_with_our_words_is_not_a_report() -> None:
    assert not explain("I have a dtype problem in my model at work, and a device problem in the other one")


def test_guard_does_not_explain_its_own_report_again() -> None:
    from torchdoctor._explain.api import classify

    assert classify(E16) is None  # guard's placement_category: its own PlacementError is not a torch error
    assert classify("RuntimeError: mat1 and mat2 must have the same dtype, but got Float and Half") == "dtype_mismatch"
    assert classify(PACKED[1]) is None  # bitsandbytes' own dtype refusal: nothing for guard to align
