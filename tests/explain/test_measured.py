"""Every text of the explain issue's "Measured" list, as a new user would paste it: category, fix fragment, and
what the diagnosis must not say (invented devices/dtypes, template holes, the wrong culprit)."""

from __future__ import annotations

import pytest

from torchdoctor._explain.api import Diagnosis, explain

CPU_GPU = "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
BNB_FRAME = '  File "/usr/lib/python3.10/site-packages/bitsandbytes/nn/modules.py", line 484, in forward\n'
GPTQ_FRAME = '  File "/usr/lib/python3.10/site-packages/auto_gptq/nn_modules/qlinear/qlinear_cuda.py", line 200, in forward\n'
VAE_FRAMES = (
    '  File "/venv/lib/python3.10/site-packages/diffusers/models/autoencoders/autoencoder_kl.py", line 304, in decode\n'
    "    decoded = self._decode(z).sample\n"
    '  File "/venv/lib/python3.10/site-packages/torch/nn/modules/conv.py", line 549, in _conv_forward\n')


def fixes(d: Diagnosis) -> str:
    return "\n".join(f"{t}\n{c}" for t, c in d.fixes)


def ranked(d: Diagnosis) -> list[str]:
    return [d.category] + [a.category for a in d.alternatives]


# (text, category, a fragment the fixes must contain)
CASES = {
    # issue 29: the direction decides. A float32 input meeting fp16/bf16 weights is the operand not cast ...
    "input/weight, only the dtype differs":
        ("RuntimeError: Input type (float) and bias type (c10::Half) should be the same", "dtype_mismatch",
         "x = x.to(next(model.parameters()).dtype)"),
    "input/weight, fp32 input into bf16 weights":
        ("RuntimeError: Input type (torch.cuda.FloatTensor) and weight type (CUDABFloat16Type) should be the same",
         "dtype_mismatch", "x = x.to(next(model.parameters()).dtype)"),
    "input/weight, uint8 image into float weights":
        ("RuntimeError: Input type (Byte) and weight type (Float) should be the same", "dtype_mismatch", ".to("),
    # ... a reduced-precision input meeting a layer left in float32 is the layer the cast left behind
    "input/weight, bf16 input into a float32 layer":
        ("RuntimeError: Input type (c10::BFloat16) and bias type (float) should be the same",
         "input_weight_type_mismatch", "layer.to(torch.bfloat16)"),
    "device mismatch through bitsandbytes": (BNB_FRAME + CPU_GPU, "quantization_device", "quantization_config"),
    "device mismatch through GPTQ": (GPTQ_FRAME + CPU_GPU.replace("cpu", "cuda:1"), "quantization_device",
                                     'device_map={"": 0}'),
    "xformers built for a CPU torch":
        ("WARNING[XFORMERS]: xFormers can't load C++/CUDA extensions. xFormers was built for:\n"
         "    PyTorch 2.1.0+cu121 with CUDA 1201 (you have 2.1.0+cpu)\n    Python  3.10.13 (you have 3.10.13)",
         "no_accelerator", "download.pytorch.org/whl/cu"),
    "xformers built for another torch":
        ("WARNING[XFORMERS]: xFormers can't load C++/CUDA extensions. xFormers was built for:\n"
         "    PyTorch 2.1.2+cu121 with CUDA 1201 (you have 2.2.0+cu121)\n    Python  3.10.11 (you have 3.10.11)",
         "backend_op_missing", "pip install -U xformers"),
    "xformers is-not-supported-because list":
        ("NotImplementedError: No operator found for `memory_efficient_attention_forward` with inputs:\n"
         "     query       : shape=(1, 4096, 8, 40) (torch.float16)\n"
         "`cutlassF` is not supported because:\n    xFormers wasn't build with CUDA support\n"
         "`flshattF@v2.3.6` is not supported because:\n    xFormers wasn't build with CUDA support\n"
         "    operator wasn't built - see `python -m xformers.info` for more info",
         "backend_op_missing", "xformers.info"),
    "meta placeholder, accelerate's words":
        ("ValueError: model.layers.0.self_attn.q_proj.weight is on the meta device, we need a value to put in on "
         "cuda:0.", "mixed_device_model", "hf_device_map"),
    "out-tensor dtype": ("RuntimeError: result type Float can't be cast to the desired output type Long",
                         "dtype_mismatch", ".long()"),
    "lower-case paste": (CPU_GPU.lower(), "device_mismatch", 'model.to("cuda:0")'),
    "no leading quote": ("NotImplementedError: Could not run aten::empty_strided with arguments from the CUDA "
                         "backend. aten::empty_strided is only available for these backends: [CPU, MPS, Meta].",
                         "no_accelerator", "whl/cu"),
    "no prefix": ("Input type (torch.cuda.HalfTensor) and weight type (torch.cuda.FloatTensor) should be the same",
                  "input_weight_type_mismatch", "layer.to(torch.float16)"),
    "wrapped": ("RuntimeError: Expected all tensors to be on the same device, but found at least two\n"
                "    devices, cuda:0 and cpu! (when checking argument for argument index in method "
                "wrapper__index_select)", "device_mismatch", 'model.to("cuda:0")'),
    "truncated": (CPU_GPU[:-4], "device_mismatch", 'model.to("cuda:0")'),
    "ANSI and Windows line ends": ("\x1b[31mRuntimeError\x1b[0m: expected scalar type Float but found BFloat16\r\n",
                                   "dtype_mismatch", ".float()"),
    "full-width punctuation": ("RuntimeError\uff1aExpected all tensors to be on the same device\uff0c but found at "
                               "least two devices\uff0c cuda:0 and cpu\uff01", "device_mismatch", 'model.to("cuda:0")'),
    "bitsandbytes, current wording":
        ("RuntimeError: Input tensors need to be on the same GPU, but found the following tensor and device "
         "combinations:\n [(torch.Size([1, 4096]), device(type='cuda', index=0)), (torch.Size([2048, 1]), "
         "device(type='cpu'))]", "quantization_device", 'device_map={"": "cuda:0"}'),
    "generator of another device": ("RuntimeError: Cannot generate a cpu tensor from a generator of type cuda.",
                                    "device_mismatch", "torch.Generator(device="),
    "torch.complex in bfloat16": ("RuntimeError: Expected both inputs to be Half, Float or Double tensors but got "
                                  "BFloat16 and BFloat16", "unsupported_dtype_on_device", ".float()"),
    "upper-case devices": (CPU_GPU.replace("cuda:0 and cpu", "CPU and CUDA:0"), "device_mismatch",
                           'model.to("cuda:0")'),
    "two GPUs": (CPU_GPU.replace("cpu!", "cuda:1!"), "device_mismatch", "CUDA_VISIBLE_DEVICES=0"),
    "VAE decode, bf16 input and fp16 bias":
        (VAE_FRAMES + "RuntimeError: Input type (c10::BFloat16) and bias type (c10::Half) should be the same",
         "input_weight_type_mismatch", "pipe.vae.to(torch.bfloat16)"),
    "old backend wording": ("RuntimeError: Expected object of backend CUDA but got backend CPU for argument #2 'mat2'",
                            "device_mismatch", 'model.to("cuda:0")'),
    "tensor_parallel": ("RuntimeError: All tensors must be on devices[0]: 0", "device_mismatch", '.to("cuda:0")'),
    "old grad_output wording":
        ("RuntimeError: Expected tensor for argument #1 'grad_output' to have the same type as tensor for argument "
         "#2 'weight'; but type torch.cuda.HalfTensor does not equal torch.cuda.FloatTensor (while checking "
         "arguments for cudnn_convolution_backward_input)", "input_weight_type_mismatch", "layer.to(torch.float16)"),
    "no XPU in this torch": ("AssertionError: Torch not compiled with XPU enabled", "no_accelerator", "whl/xpu"),
    "FlashAttention in float32": ("RuntimeError: FlashAttention only support fp16 and bf16 data type",
                                  "unsupported_dtype_on_device", "dtype=torch.bfloat16"),
    "no NVIDIA driver": ("RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA "
                         "GPU and installed a driver from http://www.nvidia.com/Download/index.aspx",
                         "no_accelerator", "nvidia-smi"),
    "vLLM on a T4": ("ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your "
                     "Tesla T4 GPU has compute capability 7.5. You can use float16 instead by explicitly setting "
                     "the`dtype` flag in CLI, for example: --dtype=half.", "unsupported_dtype_on_device",
                     "--dtype=half"),
    "invalid device ordinal": ("RuntimeError: CUDA error: invalid device ordinal", "no_accelerator",
                               "--nproc_per_node"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_measured_text(name: str) -> None:
    text, category, fragment = CASES[name]
    found = explain(text)
    assert found, name
    d = found[0]
    assert d.category == category, (name, ranked(d))
    assert fragment in fixes(d), (name, d.fixes)
    assert "this backend" not in str(d) and "{" not in d.what_happened + "".join(d.likely_causes)


def test_close_calls_offer_the_other_category() -> None:
    only_dtype = explain(CASES["input/weight, only the dtype differs"][0])[0]
    assert ranked(only_dtype)[:2] == ["dtype_mismatch", "input_weight_type_mismatch"]
    layer_left = explain(CASES["input/weight, bf16 input into a float32 layer"][0])[0]
    assert ranked(layer_left)[:2] == ["input_weight_type_mismatch", "dtype_mismatch"]
    only_device = explain("Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) should be the same")[0]
    assert ranked(only_device)[:2] == ["input_weight_type_mismatch", "device_mismatch"]
    bnb = explain(BNB_FRAME + CPU_GPU)[0]
    assert ranked(bnb)[:2] == ["quantization_device", "device_mismatch"]
    assert "bitsandbytes" in bnb.alternatives[0].why or "device" in bnb.alternatives[0].why
    plain = explain(CPU_GPU)[0]
    assert ranked(plain)[:2] == ["device_mismatch", "quantization_device"]
    assert all(a.why and 0 < a.confidence < plain.confidence for a in plain.alternatives)


def test_devices_and_dtypes_are_the_texts() -> None:
    upper = explain(CASES["upper-case devices"][0])[0]
    assert "cpu and cuda:0" in upper.what_happened and "one device" not in upper.what_happened
    two = explain(CASES["two GPUs"][0])[0]
    assert "cuda:0 and cuda:1" in two.what_happened
    assert "device_map" in two.likely_causes[0] and "tokenizer" not in two.likely_causes[0]
    assert "CPU" not in two.likely_causes[0]
    vae = explain(CASES["VAE decode, bf16 input and fp16 bias"][0])[0]
    assert "VAE" in vae.likely_causes[0] and "float32" not in vae.likely_causes[0] + fixes(vae)
    assert "bfloat16 input, float16 bias" in vae.likely_causes[0]


@pytest.mark.parametrize("text", [
    "RuntimeError: mat1 and mat2 must have the same dtype",
    "RuntimeError: Expected all tensors to be on the same device",
    "RuntimeError: Input type and weight type should be the same",
    "RuntimeError: FlashAttention only support fp16 and bf16 data type",
    "torch.OutOfMemoryError or not: Could not run 'aten::add' with arguments from the 'QuantizedCUDA' backend.",
])
def test_nothing_invented(text: str) -> None:
    """A text that names no dtype gets no float16 claim; one that names no device gets no cuda:0 claim."""
    for d in explain(text):
        said = d.what_happened + "\n".join(d.likely_causes)
        assert "float16" not in said.replace("float16 and bfloat16", "").replace("float16/bfloat16", ""), said
        assert "cuda:0" not in said + fixes(d), (text, said, d.fixes)
        assert "this backend" not in str(d) and "this dtype" not in said


def test_transformers_keyword_follows_the_version_in_the_log() -> None:
    err = "RuntimeError: FlashAttention only support fp16 and bf16 data type"
    new = fixes(explain("transformers==5.0.0\n" + err)[0])
    assert "dtype=torch.bfloat16" in new and "torch_dtype" not in new
    old = fixes(explain("- `transformers` version: 4.40.2\n" + err)[0])
    assert "torch_dtype=torch.bfloat16" in old
    unknown = fixes(explain(err)[0])
    assert "(name, dtype=torch.bfloat16" in unknown and "# transformers < 4.56: torch_dtype=" in unknown


def test_mac_build_without_cuda_and_windows_paths() -> None:
    mac = explain(CASES["no leading quote"][0])[0]
    assert mac.category == "no_accelerator" and "mps" in fixes(mac)
    win = explain('  File "C:\\Users\\me\\ComfyUI\\nodes.py", line 552, in load_checkpoint\n'
                  "AssertionError: Torch not compiled with CUDA enabled")[0]
    assert "Mac" not in win.likely_causes[0]  # C:\Users is Windows, not macOS's /Users
    real_mac = explain('  File "/Users/me/ComfyUI/nodes.py", line 552\nAssertionError: Torch not compiled with CUDA '
                       "enabled")[0]
    assert "Mac" in real_mac.likely_causes[0]
