"""explain, issue 41 point 7 (session 11): every quoting, MPS and XPU wordings, frames and words as evidence.

Each text is quoted from the public thread named beside it (most of them are in the ninth held-out collection,
``holdout/``); where the test adds the quoting (a JSON string, HTML entities, a ``>`` prefix), it says so.
"""

from __future__ import annotations

import json

import pytest

from torchdoctor._explain.api import Diagnosis, explain


def top(text: str) -> Diagnosis:
    found = explain(text)
    assert found, text
    return found[0]


def codes(d: Diagnosis) -> str:
    return "\n".join(c for _, c in d.fixes)


def ranked(d: Diagnosis) -> list[str]:
    return [d.category] + [a.category for a in d.alternatives]


# --- families the ninth collection found missing -------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    # zichongli5/NorMuon#7 (inline code quoting, a trailing period inside it)
    "`RuntimeError: expected dtype float for end but got dtype c10::BFloat16. `",
    # SqueezeAILab/LLM2LLM#5 (the operand's name in backticks)
    "expected dtype float for `end` but got dtype c10::BFloat16",
])
def test_lerp_names_the_operand_in_another_dtype(text: str) -> None:
    d = top(text)
    assert d.category == "dtype_mismatch" and d.signature == "dtype.operand_expected"
    assert "`end` is bfloat16, the others are float32" in d.what_happened
    assert "t = t.float()  # t: the operand that is bfloat16" in codes(d)
    assert "c10::" not in codes(d) and "bfloat16." not in codes(d)


def test_sdpa_bias_in_another_dtype() -> None:
    d = top("RuntimeError: invalid dtype for bias - should match query's dtype")  # aigc-apps/EasyAnimate#97
    assert d.category == "dtype_mismatch" and d.signature == "dtype.attn_bias"
    assert "attn_mask" in codes(d)


def test_diffusers_refuses_to_move_a_bitsandbytes_component() -> None:
    """huggingface/diffusers#10653: enable_model_cpu_offload on an 8-bit transformer."""
    d = top("The module 'HunyuanVideoTransformer3DModel' has been loaded in `bitsandbytes` 8bit and moving it to cpu "
            "via `.to()` is not supported. Module is still on cuda:0")
    assert d.category == "quantization_device" and d.signature == "quant.bnb_to"


META_WORDS = ("Loading T5 encoder separately with StableDiffusion3Pipeline causes meta tensor error on "
              "sequential/model cpu offload\n\nsupplying a T5 encoder loaded separately causes a meta tensor data copy "
              "error when calling ``enable_sequential_cpu_offload()``")  # huggingface/diffusers#8644


def test_a_meta_tensor_error_told_in_words_is_weak_evidence() -> None:
    d = top(META_WORDS)
    assert d.category == "mixed_device_model" and d.signature == "partial.meta_tensor"
    assert d.confidence < 0.7 and "missing" in d.title
    # with the message itself, the message's signature speaks alone
    full = explain(META_WORDS + "\nNotImplementedError: Cannot copy out of meta tensor; no data!")
    assert full[0].category == "mixed_device_model"
    assert not any(x.signature.startswith("partial.") for x in full), [x.signature for x in full]


# --- "GPU" in older wordings: on a Mac it is the Apple GPU ---------------------------------------------------------
LEGACY = "RuntimeError: Tensor for argument #2 'mat2' is on CPU, but expected it to be on GPU (while checking arguments for mm)"


@pytest.mark.parametrize("text", [
    # DanielAvdar/tabnet#269: the message in a markdown quote (">") below prose naming the MPS backend
    "When running TabNetEncoder on Apple Silicon using the MPS backend, a RuntimeError occurs because "
    "self.group_attention_matrix remains on the CPU even after calling .to(device).\n\n**Error Message:**\n\n> " + LEGACY,
    # storyicon/comfyui_segment_anything#68: a ComfyUI log on a Mac (the test shortens its frames)
    "platform: mac arm64\ndevice: mps\n\n!!! Exception during processing!!! " + LEGACY[14:] + "\nTraceback (most recent "
    "call last):\n  File \"/Users/liangbinsi/Documents/ComfyUI/execution.py\", line 151, in recursive_execute",
])
def test_gpu_on_a_mac_is_mps(text: str) -> None:
    d = top(text)
    assert d.category == "device_mismatch"
    assert "mps:0" in d.what_happened and "cuda" not in d.what_happened
    assert "cuda" not in codes(d) and "device_map" not in codes(d)


def test_gpu_elsewhere_stays_cuda() -> None:
    assert "cuda:0" in top(LEGACY).what_happened
    # a Mac user's paste of a CUDA machine's log: the log's own CUDA device wins
    assert "cuda:0" in top("On my MacBook I ssh into the server:\nINFO device=cuda:0\n" + LEGACY).what_happened


# --- every quoting and escaping (the quoting added by the test is named) ----------------------------------------
DEVICE = ("RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and "
          "cpu!")
BNB_FRAME = ('  File "/venv/lib/python3.10/site-packages/bitsandbytes/nn/modules.py", line 484, in forward\n'
             "    return bnb.matmul_4bit(x, self.weight.t(), bias=bias, quant_state=self.weight.quant_state)")


def test_a_traceback_in_one_json_string_keeps_its_frames() -> None:
    """A traceback logged as one JSON string: its lines joined by ``\\n`` escapes, its quotes as ``\\"``."""
    text = json.dumps({"traceback": "Traceback (most recent call last):\n" + BNB_FRAME + "\n" + DEVICE})
    assert "\\n" in text and '\\"' in text
    d = top(text)
    assert d.category == "quantization_device" and "device_map" in codes(d)


def test_html_escaped_frame_and_message() -> None:
    """unslothai/unsloth#212's frame and message, copied as a web page's source (the entities are the test's)."""
    text = ("  File &quot;&lt;string&gt;&quot;, line 374, in _fast_inner_training_loop\n"
            "RuntimeError: expected mat1 and mat2 to have the same dtype, but got: c10::Half != float")
    d = top(text)
    assert d.category == "dtype_mismatch" and "float16" in d.what_happened and "&" not in d.what_happened


def test_a_fenced_log_with_a_language_tag_and_indented_frames() -> None:
    """CS1o/Stable-Diffusion-Info#19: a web UI console log in a ```Shell fence, frames indented by the web UI."""
    text = ("RuntimeError: Input type (float) and bias type (struct c10::Half) should be same\n\n```Shell\n"
            '      File "E:\\Stable diffusion\\stable-diffusion-webui-amdgpu\\repositories\\k-diffusion\\k_diffusion'
            '\\sampling.py", line 594, in sample_dpmpp_2m\n        denoised = model(x, sigmas[i] * s_in, **extra_args)\n'
            "```")
    d = top(text)
    assert d.category == "dtype_mismatch" and "float32" in d.what_happened and "float16" in d.what_happened


def test_float8_on_mps_after_a_full_width_colon() -> None:
    """pytorch/pytorch#148420: "Error：" with a full-width colon; float8, never the bfloat16 / macOS 14 answer."""
    d = top("MPS use Flux.1\n\nError：Trying to convert Float8_e4m3fn to the MPS backend but it does not have support "
            "for that dtype.")
    assert d.signature == "unsupported.mps_fp8" and "float8" in d.what_happened
    assert d.likely_causes[0].startswith("float8 weights") and "a newer macOS does not help" in d.likely_causes[0]


def test_mps_placeholder_under_a_linear_frame() -> None:
    """YaoYinYing/RFdiffusion#5."""
    d = top('File "/Users/rshams/anaconda3/envs/RFdiffusion/lib/python3.10/site-packages/torch/nn/modules/linear.py",'
            " line 116, in forward\n    return F.linear(input, self.weight, self.bias)\nRuntimeError: Placeholder "
            "storage has not been allocated on MPS device!")
    assert d.category == "device_mismatch" and d.signature == "device.mps_placeholder"
    assert "mps" in codes(d)


# --- XPU wordings ----------------------------------------------------------------------------------------------
def test_xpu_layer_with_a_cpu_input() -> None:
    """Comfy-Org/ComfyUI#7089 (Intel Arc A770): oneDNN's longer wording."""
    d = top("!!! Exception during processing !!! Input type (torch.FloatTensor) and weight type (XPUFloatType) should "
            "be the same or input should be a MKLDNN tensor and weight is a dense tensor")
    assert d.category == "input_weight_type_mismatch" and "xpu" in d.what_happened


def test_xpu_not_linked() -> None:
    d = top("RuntimeError: PyTorch is not linked with support for xpu devices")  # intel/ipex-llm#11525
    assert d.category == "no_accelerator" and "xpu" in codes(d)


# --- words in prose never outrank the message ----------------------------------------------------------------
@pytest.mark.parametrize("text,category,prose", [
    # huggingface/diffusers#5897: "LoRA" all over the prose
    ("LORA error when running train_text_to_image_lora.py\n\nI tried to experiment with LoRA training following "
     "examples/text_to_image/README.md#training-with-lora.\n\nHowever, I got the error ```RuntimeError: Expected all "
     "tensors to be on the same device, but found at least two devices, cuda:0 and cpu! (when checking argument for "
     "argument mat2 in method wrapper_CUDA_mm)``` on line 801.", "device_mismatch", "quantization_device"),
    # XLabs-AI/x-flux-comfyui#11: an fp8 model in the log lines before the message
    ("got prompt\nmodel weight dtype torch.float8_e4m3fn, manual cast: torch.bfloat16\nmodel_type FLUX\n!!! Exception "
     "during processing!!! Expected all tensors to be on the same device, but found at least two devices, cuda:0 and "
     "cpu! (when checking argument for argument mat1 in method wrapper_CUDA_addmm)", "device_mismatch",
     "unsupported_dtype_on_device"),
    # hiyouga/LlamaFactory#2022: 4-bit quantization and LoRA in the command line
    ("unsloth 报错：RuntimeError: expected mat1 and mat2 to have the same dtype, but got: c10::BFloat16 != float\n\n"
     "python3.10 train_bash.py --stage sft --finetuning_type lora --use_unsloth --quantization_bit 4",
     "dtype_mismatch", "quantization_device"),
])
def test_words_around_the_message_do_not_refile_it(text: str, category: str, prose: str) -> None:
    d = top(text)
    assert d.category == category, ranked(d)
    assert d.category != prose


@pytest.mark.parametrize("message,category", [
    ("RuntimeError: Tensor for argument input is on cpu but expected on mps", "device_mismatch"),
    ("RuntimeError: Placeholder storage has not been allocated on MPS device!", "device_mismatch"),
    ("RuntimeError: Expected all tensors to be on the same device, but got mat2 is on cpu, different from other "
     "tensors on cuda:0 (when checking argument in method wrapper_CUDA_mm)", "device_mismatch"),
    ("RuntimeError: Expected all tensors to be on the same device, but got index is on xpu:0, different from other "
     "tensors on cpu (when checking argument in method wrapper_XPU__index_select)", "device_mismatch"),
])
def test_prose_typed_on_the_errors_own_line_is_prose(message: str, category: str) -> None:
    """The hunter's finding: "Using qlora with peft on my mac, then: <message>" on one line re-filed the message as
    quantization_device. The words before the error on its own line are what the user believes; they may offer an
    alternative, never the diagnosis. In a frame or a line of code the same words count in full."""
    d = top("Using qlora with peft on my mac, then: " + message)
    assert d.category == category, ranked(d)
    assert "quantization_device" in ranked(d)[1:]
    frame = '  File "/envs/x/lib/python3.11/site-packages/bitsandbytes/nn/modules.py", line 484, in forward\n'
    if "mps" not in message.lower():
        assert top(frame + message).category == "quantization_device"


# --- one error printed twice is one diagnosis ----------------------------------------------------------------------
SHORT_THEN_FULL = (
    "got prompt\n"
    "!!! Exception during processing !!! Expected all tensors to be on the same device, but found at least two "
    "devices, cuda:0 and cpu!\nTraceback (most recent call last):\n"
    '  File "D:\\ComfyUI_windows_portable\\ComfyUI\\execution.py", line 524, in execute\n'
    '  File "D:\\ComfyUI_windows_portable\\ComfyUI\\custom_nodes\\LanPaint\\nodes.py", line 412, in sample\n'
    "    x = torch.cat([latent, mask], dim=1)\n"
    "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! "
    "(when checking argument for argument tensors in method wrapper_CUDA_cat)\n")


def test_an_error_printed_short_then_in_full_is_one_diagnosis() -> None:
    """The hunter's ComfyUI log: the header line and the traceback's last line are the same error."""
    found = explain(SHORT_THEN_FULL)
    assert len(found) == 1 and found[0].count == 2
    assert "(cat)" in found[0].what_happened and "tensors" in found[0].what_happened


def test_two_errors_of_one_family_stay_two() -> None:
    other = SHORT_THEN_FULL.replace("cuda:0 and cpu! (when", "cuda:1 and cpu! (when")
    assert len(explain(other)) == 2


@pytest.mark.parametrize("text,into", [
    # kijai/ComfyUI-WanVideoWrapper#204: an fp16 input meeting an fp8 bias with full offloading
    ("RuntimeError: Input type (struct c10::Half) and bias type (struct c10::Float8_e4m3fn) should be the same",
     "float16"),
    ("RuntimeError: mat1 and mat2 must have the same dtype, but got BFloat16 and Float8_e4m3fn", "bfloat16"),
])
def test_an_fp8_model_is_loaded_in_its_inputs_dtype(text: str, into: str) -> None:
    """Loading the fp8 model in bf16 beside an fp16 input trades one mismatch for another: the input's dtype."""
    d = top(text)
    assert f"model.to(torch.{into})" in codes(d)
    assert "float8" not in codes(d).replace("self.weight.to(x.dtype)", "")


# --- the ninth collection in every quoting -------------------------------------------------------------------------
def _quotings(text: str) -> dict[str, str]:
    import html as _html
    return {
        "json": json.dumps({"error": text}),  # an app's error answer
        "json in json": json.dumps({"body": json.dumps({"exception_message": text})}),  # posted through another API
        "html": "<pre>" + _html.escape(text) + "</pre>",  # a web page's source
        "quote": "\n".join("> " + line for line in text.split("\n")),  # a markdown reply
        "fence": "```python\n" + text + "\n```",
        "crlf": text.replace("\n", "\r\n"),  # a Windows log
        "prose": "Using qlora with peft and lora on my machine, fp8 too, then:\n" + text,
    }


def test_the_ninth_collection_reads_the_same_in_every_quoting() -> None:
    """Every held-out text of the ninth collection that explain files right as pasted is filed the same way once
    re-quoted as a JSON string, a JSON string inside one, HTML, a markdown quote or fence, with Windows line ends,
    or under a line of prose full of the words of other families (measured: 121 texts x 7 quotings, all kept)."""
    import pathlib
    held = pathlib.Path(__file__).parent / "holdout"
    checked = 0
    wrong: list[tuple[str, str, str | None]] = []
    for path in sorted(held.glob("*.txt")):
        head, _, body = path.read_text(encoding="utf-8").partition("\n---\n")
        if "# collection: 9" not in head:
            continue
        want = next(line[12:] for line in head.splitlines() if line.startswith("# category: "))
        first = explain(body)
        if not first or first[0].category != want:
            continue
        for how, text in _quotings(body).items():
            got = explain(text)
            checked += 1
            if not got or got[0].category != want:
                wrong.append((path.name, how, got[0].category if got else None))
    assert checked >= 120 * 7 and not wrong, wrong


# --- an Intel GPU or a Mac gets no CUDA install --------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    # IamCreateAI/Ruyi-Models#31: a node calling CUDA in ComfyUI on an Intel Arc A770
    "Sampler for Image to Video ERROR：Torch not compiled with CUDA enabled（Intel Arc XPU ）\n\n# ComfyUI Error "
    "Report\n## Error Details\n- **Node Type:** Ruyi_I2VSampler\n- **Exception Type:** AssertionError\n- **Exception "
    "Message:** Torch not compiled with CUDA enabled\n## Stack Trace\n```\n  File \"/home/junwei161/ComfyUI/execution.py\""
    ", line 327, in execute",
    # eleiton/ollama-intel-arc#26: the comfyui-ipex container's log
    "comfyui-ipex erroring over nvidia drivers\n\n`comfyui-ipex      | RuntimeError: Found no NVIDIA driver on your "
    "system. Please check that you have an NVIDIA GPU and installed a driver from "
    "http://www.nvidia.com/Download/index.aspx`",
])
def test_comfyui_on_an_intel_gpu_gets_the_xpu_build(text: str) -> None:
    d = top(text)
    assert d.category == "no_accelerator"
    first = d.fixes[0][1] + "\n" + d.fixes[1][1]
    assert "torch.xpu.is_available()" in first and "whl/xpu" in first
    assert "whl/cu" not in codes(d) and "python_embeded" not in codes(d)


def test_half_on_a_macs_cpu_picks_the_dtype_from_the_device() -> None:
    """Parskatt/RoMa#26 on a Mac: "torch.cuda.is_available()" is never true there."""
    d = top('  File "/Users/rkothari/anaconda3/envs/horizon/lib/python3.10/site-packages/torch/nn/functional.py", line '
            "2546, in layer_norm\nRuntimeError: \"LayerNormKernelImpl\" not implemented for 'Half")
    assert d.category == "unsupported_dtype_on_device"
    assert 'dtype = torch.float32 if device.type == "cpu" else torch.float16' in codes(d)
    assert "cuda.is_available" not in codes(d) and "whl/cu" not in codes(d)


ADDMM = ("RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! "
         "(when checking argument for argument mat1 in method wrapper_CUDA_addmm)")


@pytest.mark.parametrize("prose", [
    "Title: qlora training crash\n\n",  # a label typed before a title is prose, not a log record
    "I am fine-tuning with qlora (peft + bitsandbytes not used yet, plain fp16)\n",  # an aside in parentheses
])
def test_prose_lines_with_a_label_or_an_aside_stay_prose(prose: str) -> None:
    """The hunter's second E1 round: both re-filed the device message as quantization_device."""
    d = top(prose + ADDMM)
    assert d.category == "device_mismatch" and "quantization_device" in ranked(d)[1:]
    # a log record and a line of code keep their full weight
    assert top('  File "/x/site-packages/bitsandbytes/nn/modules.py", line 4, in forward\n' + ADDMM).category == \
        "quantization_device"
    assert top("return bnb.matmul_4bit(x, w)\n" + ADDMM).category == "quantization_device"
