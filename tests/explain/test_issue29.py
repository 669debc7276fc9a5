"""Issue 29's misses and issue 26's app fixes, each as a user would paste it (texts quoted or shortened from the
fixtures named beside them; tests/explain/SOURCES.md gives the threads)."""

from __future__ import annotations

import pytest

from torchdoctor._explain.api import Diagnosis, explain


def top(text: str) -> Diagnosis:
    found = explain(text)
    assert found, text
    return found[0]


def fixes(d: Diagnosis) -> str:
    return "\n".join(f"{t}\n{c}" for t, c in d.fixes)


def ranked(d: Diagnosis) -> list[str]:
    return [d.category] + [a.category for a in d.alternatives]


@pytest.mark.parametrize(("text", "category"), [
    # float32 (or double / integer) input into reduced-precision weights: the operand was not cast
    ("RuntimeError: Input type (torch.cuda.FloatTensor) and weight type (torch.cuda.HalfTensor) should be the same",
     "dtype_mismatch"),
    ("RuntimeError: Input type (CUDAFloatTensor) and weight type (CUDAHalfTensor) should be the same",
     "dtype_mismatch"),
    ("RuntimeError: Input type (torch.cuda.DoubleTensor) and weight type (torch.cuda.FloatTensor) should be the same",
     "dtype_mismatch"),
    # a reduced input into a layer left in float32, or on another device: the layer the cast left behind
    ("RuntimeError: Input type (torch.cuda.HalfTensor) and weight type (torch.cuda.FloatTensor) should be the same",
     "input_weight_type_mismatch"),
    ("RuntimeError: Input type (torch.cuda.HalfTensor) and weight type (torch.HalfTensor) should be the same",
     "input_weight_type_mismatch"),
])
def test_direction_of_input_and_weight(text: str, category: str) -> None:
    d = top(text)
    assert d.category == category, ranked(d)
    other = {"dtype_mismatch": "input_weight_type_mismatch"}.get(category)
    if other:
        assert ranked(d)[1] == other  # the close call is offered


@pytest.mark.parametrize("text", [
    "RuntimeError: Expected out tensor to have dtype float, but got double instead",
    "RuntimeError: expected dtype Float for `out` but got dtype Double",
    "RuntimeError: result type Float can't be cast to the desired output type Long",
])
def test_out_dtype(text: str) -> None:
    d = top(text)
    assert d.category == "dtype_mismatch" and "out=" in d.what_happened


# Frames alone (the message cut off): Tune-A-Video#97, sliders#78, bitsandbytes#902, darts#2326, project-NN#5.
XFORMERS = '''  File "/mnt/data/Tune-A-Video/train_tuneavideo.py", line 123, in main
    unet.enable_xformers_memory_efficient_attention()
  File "/home/u/.local/lib/python3.10/site-packages/diffusers/modeling_utils.py", line 196, in fn_recursive_set_mem_eff
    module.set_use_memory_efficient_attention_xformers(valid)'''
# the same failure on Windows without code lines (a console that shows frames only): the frame names xformers
_FMHA = r"C:\Users\u\ComfyUI_windows_portable\python_embeded\Lib\site-packages\xformers\ops\fmha\__init__.py"
XFORMERS_WIN = f'''  File "{_FMHA}", line 223, in memory_efficient_attention
  File "{_FMHA}", line 321, in _memory_efficient_attention'''
BNB = '''  File "/root/env/lib/python3.10/site-packages/bitsandbytes/nn/modules.py", line 248, in forward
    out = bnb.matmul_4bit(x, self.weight.t(), bias=bias, quant_state=self.weight.quant_state)
  File "/root/env/lib/python3.10/site-packages/bitsandbytes/autograd/_functions.py", line 579, in matmul_4bit
    return MatMul4Bit.apply(A, B, out, bias, quant_state)'''
MODULE_TO_MPS = '''File ~/miniconda3/lib/python3.10/site-packages/pytorch_lightning/strategies/single_device.py:74, in model_to_device
---> 74     self.model.to(self.root_device)  # root_device: mps
File ~/miniconda3/lib/python3.10/site-packages/torch/nn/modules/module.py:1145, in Module.to(self, *args, **kwargs)
   1143     return t.to(device, dtype if t.is_floating_point() or t.is_complex() else None, non_blocking)
-> 1145 return self._apply(convert)'''
STFT = '''  File "/content/project/model.py", line 957, in compute
    pad_mode="constant")
  File "/usr/local/lib/python3.6/dist-packages/torch/functional.py", line 516, in stft
    normalized, onesided, return_complex)
RuntimeError: Expected all te'''


@pytest.mark.parametrize(("text", "category", "fragment"), [
    (XFORMERS, "backend_op_missing", "xformers"),
    (XFORMERS_WIN, "backend_op_missing", "xformers"),
    (BNB, "quantization_device", "device_map"),
    (MODULE_TO_MPS, "unsupported_dtype_on_device", "float32"),
    (STFT, "device_mismatch", "hann_window(win_length, device=x.device)"),
])
def test_frames_are_evidence_and_the_diagnosis_says_so(text: str, category: str, fragment: str) -> None:
    d = top(text)
    assert d.category == category, ranked(d)
    assert fragment in fixes(d), d.fixes
    assert "stack" in d.title or "cut off" in d.what_happened
    assert d.confidence < 0.7  # frames are weaker evidence than a message


def test_frames_stay_quiet_when_the_message_is_there() -> None:
    with_message = BNB + "\nRuntimeError: Expected all tensors to be on the same device, but found at least two " \
        "devices, cuda:0 and cpu!"
    found = explain(with_message)
    assert [d.category for d in found] == ["quantization_device"]
    assert not found[0].title.startswith("From the stack")


@pytest.mark.parametrize("frames", [
    '  File "/site-packages/bitsandbytes/autograd/_functions.py", line 462, in forward',
    '  File "/site-packages/auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py", line 250, in forward',
    '  File "/site-packages/awq/modules/linear/gemm.py", line 200, in forward',
])
@pytest.mark.parametrize("pair", ["xpu:0 and cpu", "cuda:0 and cuda:1", "cuda:0 and cpu"])
def test_quantized_stack_with_a_plain_device_message(frames: str, pair: str) -> None:
    d = top(f"{frames}\nRuntimeError: Expected all tensors to be on the same device, but found at least two "
            f"devices, {pair}!")
    assert d.category == "quantization_device", ranked(d)


def test_mps_float8_is_not_the_bfloat16_story() -> None:
    d = top("TypeError: Trying to convert Float8_e4m3fn to the MPS backend but it does not have support for that "
            "dtype.")
    assert d.category == "unsupported_dtype_on_device"
    assert "float8" in d.likely_causes[0] and "not the bfloat16" in d.likely_causes[0]
    assert "macOS 14+" not in d.likely_causes[0]
    bf16 = top("TypeError: BFloat16 is not supported on MPS")
    assert "macOS 14" in bf16.likely_causes[0]


@pytest.mark.parametrize("text", [
    "ValueError: `.to` is not supported for `4-bit` or `8-bit` bitsandbytes models. Please use the model as it is, "
    "since the model has already been set to the correct devices and casted to the correct `dtype`.",
    "ValueError: Calling `half()` is not supported for `4-bit` or `8-bit` quantized models. Please use the model as "
    "it is, since the model has already been casted to the correct `dtype`.",
    "ValueError: `.half()` is not supported for `4-bit` or `8-bit` models. Please use the model as it is.",
    "ValueError: Calling `cuda()` is not supported for `4-bit` quantized models with the installed version of "
    "bitsandbytes.",
])
def test_transformers_refuses_to_move_a_bitsandbytes_model(text: str) -> None:
    d = top(text)
    assert d.category == "quantization_device" and "device_map" in fixes(d)


def test_half_overflow() -> None:
    d = top('    scores[i, self.eos_token_id] = float(2**30)\n'
            "RuntimeError: value cannot be converted to type at::Half without overflow")
    assert d.category == "dtype_mismatch"
    assert "torch.finfo(x.dtype).min" in fixes(d) and "bfloat16" in fixes(d)


def test_stft_window_on_another_device() -> None:
    d = top("RuntimeError: stft input and window must be on the same device but got self on cpu and window on "
            "cuda:0")
    assert d.category == "device_mismatch"
    assert "cpu and cuda:0" in d.what_happened and "window" in d.likely_causes[0]


def test_cutlass_and_bf16_on_an_old_gpu() -> None:
    d = top("NotImplementedError: No operator found for `memory_efficient_attention_forward` with inputs:\n"
            "     query       : shape=(1, 577, 16, 64) (torch.bfloat16)\n"
            "`fa2F@v2.6.3` is not supported because:\n"
            "    requires device with capability > (8, 0) but your GPU has capability (7, 5) (too old)\n"
            "    bf16 is only supported on A100+ GPUs\n"
            "`cutlassF-pt` is not supported because:\n    bf16 is only supported on A100+ GPUs")
    assert set(ranked(d)[:2]) & {"backend_op_missing", "unsupported_dtype_on_device"}


# Issue 26, point 5: the app's own fix beside the generic one, when the text or its stack shows the app.
COMFY_IPEX = '''loaded partially 5630.8 5630.7 0
  File "C:\\pythonxm\\ComfyUI-master\\comfy\\model_management.py", line 334, in model_load
    self.real_model = ipex.optimize(self.real_model.eval(), inplace=True, graph_mode=True, concat_linear=True)
  File "C:\\miniconda3\\envs\\pytorch\\lib\\site-packages\\intel_extension_for_pytorch\\frontend.py", line 353, in optimize
    raise RuntimeError("The model is mixed with different device type")
RuntimeError: The model is mixed with different device type'''


def test_comfyui_ipex_after_a_lowvram_load() -> None:
    d = top(COMFY_IPEX)
    assert d.category == "mixed_device_model"
    codes = [c for _, c in d.fixes]
    assert codes[0] == "python main.py --disable-ipex-optimize"
    assert any("--highvram" in c and "--gpu-only" in c for c in codes)
    assert any("python main.py" not in c for c in codes)  # the generic fix stays
    plain = top(COMFY_IPEX.replace("ComfyUI-master\\comfy\\model_management.py", "app\\load.py")
                .replace("loaded partially 5630.8 5630.7 0\n", ""))
    assert all("python main.py" not in c for _, c in plain.fixes)  # no app in the text: no app flags


@pytest.mark.parametrize(("text", "app_fix"), [
    ("01:13:46-025320 ERROR    Exception: Input type (torch.cuda.HalfTensor) and weight type (torch.HalfTensor) "
     "should be the same\n2023-08-10 10:39:16,532 | sd | INFO | launch | Starting SD.Next",
     '"diffusers_offload_mode": "none"'),
    ("2023-08-10 10:39:16,532 | sd | INFO | launch | Starting SD.Next\n"
     "RuntimeError: Input type (c10::Half) and bias type (float) should be the same", '"no_half_vae": true'),
    ('  File "/home/u/sd-scripts/fine_tune.py", line 314, in train\n'
     "    noise_pred = unet(noisy_latents, timesteps, encoder_hidden_states).sample\n"
     "RuntimeError: Input type (float) and bias type (c10::BFloat16) should be the same", "--no_half_vae"),
    ('  File "D:\\ComfyUI_windows_portable\\ComfyUI\\execution.py", line 327, in execute\n'
     "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!",
     "python main.py --gpu-only"),
    ('  File "D:\\ComfyUI_windows_portable\\ComfyUI\\comfy\\ldm\\modules\\attention.py", line 400, in attention_xformers\n'
     "NotImplementedError: No operator found for `memory_efficient_attention_forward` with inputs:\n"
     "`cutlassF` is not supported because:\n    xFormers wasn't build with CUDA support",
     "--use-pytorch-cross-attention"),
    ("[2023-08-09 20:26:23,075]::[uvicorn.access]::INFO --> 127.0.0.1:53738 - \"POST /api/v1/sessions/ HTTP/1.1\"\n"
     "RuntimeError: Input type (c10::Half) and bias type (float) should be the same", "precision: float32"),
])
def test_app_fix_beside_the_generic_one(text: str, app_fix: str) -> None:
    d = top(text)
    codes = [c for _, c in d.fixes]
    assert app_fix in codes[0], codes
    assert len(codes) >= 2
