"""explain, issue 41 point 7 / issue 40 point 6 / issue 42 "explain on an app log".

The families are recognised in every quoting and escaping a paste arrives in; MPS and XPU wordings; frames alone are
evidence; words in prose never outrank the message; float8 on MPS is float8; an app's own switch for a step it runs
itself is among the fixes of a bare paste, never for a plugin's own tensor; the plugin in an app log is named.

The messages are real (quoted from the threads named in ``SOURCES.md``); the quoting around them is the test's.
"""

from __future__ import annotations

import json

import pytest

from torchdoctor._explain.api import Diagnosis, explain
from torchdoctor._explain.escapes import unescape

HALF = "\"addmm_impl_cpu_\" not implemented for 'Half'"  # huggingface/transformers#27769 and many more


def top(text: str) -> Diagnosis:
    found = explain(text)
    assert found, text
    return found[0]


def codes(d: Diagnosis) -> list[str]:
    return [c for _, c in d.fixes]


# --- every quoting and escaping ------------------------------------------------------------------------------------
QUOTED = [
    "RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'",
    "RuntimeError: `addmm_impl_cpu_` not implemented for 'Half'",
    "RuntimeError: 'addmm_impl_cpu_' not implemented for 'Half'",
    "RuntimeError: addmm_impl_cpu_ not implemented for \"Half\"",
    "RuntimeError: `addmm_impl_cpu_` not implemented for `Half`",
    # JSON: ComfyUI's API / error reports carry the message as a JSON string
    json.dumps({"exception_message": HALF, "exception_type": "RuntimeError"}),
    json.dumps({"exception_message": HALF}, ensure_ascii=True).replace("'", "\\u0027"),
    # a JSON string inside a JSON string (an error report posted through another API)
    json.dumps({"body": json.dumps({"exception_message": HALF})}),
    # HTML: a web page or a web UI's error box copied as its source
    "RuntimeError: &quot;addmm_impl_cpu_&quot; not implemented for &#39;Half&#39;",
    "<div class=\"error\">RuntimeError: &#34;addmm_impl_cpu_&#34; not implemented for &#x27;Half&#x27;</div>",
    # a logged repr of the exception
    "ERROR: RuntimeError('\"addmm_impl_cpu_\" not implemented for \\'Half\\'')",
    # typographic quotes from a rich-text editor
    "RuntimeError: \u201caddmm_impl_cpu_\u201d not implemented for \u2018Half\u2019",
]


@pytest.mark.parametrize("text", QUOTED)
def test_half_on_cpu_in_every_quoting(text: str) -> None:
    d = top(text)
    assert d.category == "unsupported_dtype_on_device", d
    assert d.signature == "unsupported.kernel"
    assert "addmm_impl_cpu_" in d.what_happened and "float16" in d.what_happened
    assert "model = model.float()" in codes(d)


@pytest.mark.parametrize("text", QUOTED)
def test_every_quoting_inside_a_long_log(text: str) -> None:
    """A log too long to be a paste keeps its escapes until a line is examined (speed): the same diagnosis."""
    from torchdoctor._explain.prefilter import EXACT_BELOW

    pad = "step 12 loss 0.41 lr 2e-05 D:\\runs\\new\\ckpt\n" * (EXACT_BELOW // 40 + 1)
    found = explain(pad + text + "\n" + pad)
    assert [d.category for d in found] == ["unsupported_dtype_on_device"], text
    assert "addmm_impl_cpu_" in found[0].what_happened and "float16" in found[0].what_happened


def test_a_json_traceback_reads_its_frames() -> None:
    """ComfyUI's /history answer: the traceback is a JSON list of frames; the frames decide (here: the node)."""
    report = {"status": {"messages": [["execution_error", {
        "node_type": "IPAdapterAdvanced",
        "exception_message": "Expected all tensors to be on the same device, but found at least two devices, "
                             "cuda:0 and cpu!",
        "traceback": ['  File "D:\\ComfyUI\\custom_nodes\\ComfyUI-IPAdapter-plus\\utils.py", line 177, in '
                      'encode_image_masked\n    out = clip_vision.model(pixel_values=pixel_values)\n']}]]}}
    for text in (json.dumps(report), "got prompt\n" * 40_000 + json.dumps(report) + "\n" + "ok\n" * 1000):
        d = top(text)
        assert d.category == "device_mismatch"
        assert "git -C custom_nodes/ComfyUI-IPAdapter-plus pull" in codes(d)


def test_unescape_leaves_plain_windows_paths() -> None:
    """A plain log's backslashes are path separators: ``\\n`` in ``ComfyUI\\nodes.py`` is no line end."""
    frame = '  File "D:\\ComfyUI_windows_portable\\ComfyUI\\nodes.py", line 1373, in sample'
    assert unescape(frame) == frame
    assert unescape("a &amp;quot; b") == "a &quot; b"  # escaped twice: undone once
    assert unescape('x = "\\ud83d"') == 'x = "?"'  # half a surrogate pair is no character


def test_html_and_json_keep_the_message_fields() -> None:
    html = ("RuntimeError: Input type (torch.cuda.HalfTensor) and weight type (torch.FloatTensor) should be the same"
            .replace("(", "&#40;").replace(")", "&#x29;"))
    d = top(html)
    assert d.category == "input_weight_type_mismatch" and "torch.cuda.HalfTensor" in d.what_happened
    j = top(json.dumps({"error": "RuntimeError: Input type (c10::BFloat16) and bias type (float) should be the same"}))
    assert j.category == "input_weight_type_mismatch" and "bfloat16" in j.what_happened


# --- MPS and XPU wordings ----------------------------------------------------------------------------------------
def test_mps_tensor_for_argument() -> None:
    d = top("RuntimeError: Tensor for argument input is on cpu but expected on mps")
    assert d.category == "device_mismatch"
    assert "cpu" in d.what_happened and "mps:0" in d.what_happened
    assert any('"mps:0"' in c or '"mps"' in c for c in codes(d))


def test_mps_conv_input_behind() -> None:
    """Gourieff/comfyui-reactor-node#77: the input stayed on the CPU while the layer is on mps."""
    d = top("RuntimeError: slow_conv2d_forward_mps: input(device='cpu') and weight(device=mps:0')  must be on the "
            "same device")
    assert d.category == "device_mismatch" and d.signature == "device.conv_input"
    assert "slow_conv2d_forward_mps" in d.what_happened and "input on cpu" in d.what_happened
    assert d.likely_causes[0].startswith("The inputs")
    assert d.alternatives[0].category == "input_weight_type_mismatch"


def test_mps_conv_weights_behind() -> None:
    d = top("RuntimeError: slow_conv2d_forward_mps: input(device='mps:0') and weight(device=cpu') must be on the "
            "same device")
    assert d.likely_causes[0].startswith("Part of the model was never moved")


@pytest.mark.parametrize("text", [
    "RuntimeError: Tensor for argument #2 'mat2' is on CPU, but expected it to be on XPU (while checking arguments "
    "for mm)",
    "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, xpu:0 and cpu! "
    "(when checking argument for argument index in method wrapper_XPU__index_select)",
    "RuntimeError: Tensor for argument input is on cpu but expected on xpu",
])
def test_xpu_wordings(text: str) -> None:
    d = top(text)
    assert d.category == "device_mismatch"
    assert "xpu:0" in d.what_happened
    assert any("xpu" in c for c in codes(d))


def test_float8_on_mps_is_float8() -> None:
    """Comfy-Org/ComfyUI#9263: not the bfloat16 / macOS 14 answer; a newer macOS does not help."""
    d = top("TypeError: Trying to convert Float8_e4m3fn to the MPS backend but it does not have support for that "
            "dtype.")
    assert d.category == "unsupported_dtype_on_device" and d.signature == "unsupported.mps_fp8"
    assert "float8" in d.title.lower() and "bfloat16" not in d.title.lower()
    assert "float8" in d.what_happened and "bfloat16" not in d.what_happened
    assert d.likely_causes[0].startswith("float8 weights")
    bf16 = top("TypeError: Trying to convert BFloat16 to the MPS backend but it does not have support for that dtype.")
    assert bf16.signature == "unsupported.mps_bf16" and "macOS 14" in bf16.likely_causes[0]


# --- frames alone ------------------------------------------------------------------------------------------------
DESERIALIZE_FRAMES = '''Traceback (most recent call last):
  File "/Users/me/tts/infer.py", line 12, in <module>
    ckpt = torch.load("hifigan.pth")
  File "/Users/me/venv/lib/python3.10/site-packages/torch/serialization.py", line 809, in load
    return _load(opened_zipfile, map_location, pickle_module, **pickle_load_args)
  File "/Users/me/venv/lib/python3.10/site-packages/torch/serialization.py", line 1116, in load_tensor
    wrap_storage=restore_location(storage, location),
  File "/Users/me/venv/lib/python3.10/site-packages/torch/serialization.py", line 217, in default_restore_location
    result = fn(storage, location)
  File "/Users/me/venv/lib/python3.10/site-packages/torch/serialization.py", line 182, in _cuda_deserialize
    device = validate_cuda_device(location)'''


def test_a_deserialize_paste_with_frames_only() -> None:
    d = top(DESERIALIZE_FRAMES)
    assert d.category == "deserialize_device" and d.signature == "frames.deserialize"
    assert d.title.startswith("From the stack") and d.confidence < 0.7
    assert any("map_location" in c for c in codes(d))
    # with the message, the message's own signature speaks and the frames stay quiet
    full = explain(DESERIALIZE_FRAMES + "\nRuntimeError: Attempting to deserialize object on a CUDA device but "
                   "torch.cuda.is_available() is False.")
    assert [x.signature for x in full] == ["deserialize.device"]


# --- prose never outranks the message ----------------------------------------------------------------------------
DEVICE = "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"


def test_a_word_in_prose_does_not_refile_the_error() -> None:
    d = top("I am doing qlora fine-tuning of llama on one GPU and get this:\n" + DEVICE)
    assert d.category == "device_mismatch"
    assert "quantization_device" in [a.category for a in d.alternatives]  # still offered
    assert not d.likely_causes[0].startswith("A bitsandbytes")


def test_the_same_word_in_a_frame_or_code_does() -> None:
    frame = ('  File "/envs/qlora/lib/python3.11/site-packages/bitsandbytes/nn/modules.py", line 484, in forward\n'
             "    return bnb.matmul_4bit(x, self.weight.t(), bias=bias, quant_state=self.weight.quant_state)\n")
    assert top(frame + DEVICE).category == "quantization_device"
    code = "model = AutoModelForCausalLM.from_pretrained(name, load_in_4bit=True)  # qlora\n"
    assert top(code + DEVICE).category == "quantization_device"


# --- the app's own switch for a step it runs itself (issue 40, point 6) -------------------------------------------
IPEX = "RuntimeError: The model is mixed with different device type"  # intel/intel-extension-for-pytorch#722


def test_ipex_mixed_in_a_bare_paste_gets_comfyui_switch() -> None:
    d = top(IPEX)
    assert d.category == "mixed_device_model"
    got = codes(d)
    assert "python main.py --disable-ipex-optimize" in got
    assert any("--highvram" in c and "--gpu-only" in c for c in got)
    assert got.index("python main.py --disable-ipex-optimize") > 0  # the plain-PyTorch fix stays first
    titles = " ".join(t for t, _ in d.fixes)
    assert "If ComfyUI raised this" in titles


def test_ipex_mixed_from_a_program_of_its_own_gets_no_app_switch() -> None:
    own = ('  File "/home/me/app/serve.py", line 40, in load\n'
           "    model = ipex.optimize(model.eval())\n" + IPEX)
    assert all("python main.py" not in c for c in codes(top(own)))


NODE_FP64 = '''!!! Exception during processing !!! expected scalar type Float but found Double
Traceback (most recent call last):
  File "/home/u/ComfyUI/execution.py", line 327, in execute
    output_data, output_ui, has_subgraph = get_output_data(obj, input_data_all, execution_block_cb=execution_block_cb)
  File "/home/u/ComfyUI/custom_nodes/comfyui-color-tools/nodes.py", line 58, in apply
    out = torch.matmul(image, self.matrix)
RuntimeError: expected scalar type Float but found Double'''


def test_a_nodes_own_float64_matrix_gets_no_app_wide_flag() -> None:
    d = top(NODE_FP64)
    assert d.category == "dtype_mismatch"
    got = codes(d)
    assert not any("--force-fp32" in c or "python main.py" in c for c in got), got
    assert "custom_nodes/comfyui-color-tools/nodes.py:58" in d.likely_causes[0]
    assert "git -C custom_nodes/comfyui-color-tools pull" in got
    # the app setting as the cause (a half-precision model meeting a float32 hint) still gets the app's flag
    half = NODE_FP64.replace("Float but found Double", "Half but found Float")
    assert any("--force-fp32" in c for c in codes(top(half)))


# --- the plugin in an app log (issue 42) -------------------------------------------------------------------------
COMFY_LOG = '''got prompt
Requested to load CLIPVisionModelProjection
loaded completely 0.0 1208.09 True
!!! Exception during processing !!! Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!
Traceback (most recent call last):
  File "D:\\ComfyUI_windows_portable\\ComfyUI\\execution.py", line 327, in execute
    output_data, output_ui, has_subgraph = get_output_data(obj, input_data_all, execution_block_cb=execution_block_cb)
  File "D:\\ComfyUI_windows_portable\\ComfyUI\\custom_nodes\\ComfyUI-IPAdapter-plus\\IPAdapterPlus.py", line 790, in apply_ipadapter
    return ipadapter_execute(model.clone(), ipadapter['ipadapter']['model'], ipadapter['clipvision']['model'])
  File "D:\\ComfyUI_windows_portable\\ComfyUI\\custom_nodes\\ComfyUI-IPAdapter-plus\\utils.py", line 177, in encode_image_masked
    out = clip_vision.model(pixel_values=pixel_values, intermediate_output=-2)
RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!

Prompt executed in 2.51 seconds'''


def test_a_comfyui_log_names_the_node() -> None:
    d = top(COMFY_LOG)
    got = codes(d)
    assert "git -C custom_nodes/ComfyUI-IPAdapter-plus pull" in got
    assert not any("<node>" in c for c in got)
    text = " ".join(d.likely_causes) + " ".join(t for t, _ in d.fixes)
    assert "custom_nodes/ComfyUI-IPAdapter-plus/utils.py:177" in text  # the innermost frame of the node
    assert "stft" not in d.likely_causes[0]  # "ComfyUI_windows_portable" is no stft window
    # the node's frame ran the failing code: the node's fix comes before ComfyUI's app-wide flags (issue 40, point 6)
    node_fix = got.index("git -C custom_nodes/ComfyUI-IPAdapter-plus pull")
    assert node_fix < got.index("python main.py --gpu-only  # or --highvram")
    assert any("ComfyUI-IPAdapter-plus\\utils.py\", line 177" in e for e in d.evidence)  # as the log wrote it
    # the node is named whatever the category: a dtype error inside it
    half = top(COMFY_LOG.replace("Expected all tensors to be on the same device, but found at least two devices, "
                                 "cuda:0 and cpu!", "expected scalar type Half but found Float"))
    assert half.category == "dtype_mismatch"
    assert any("ComfyUI-IPAdapter-plus\\utils.py" in e for e in half.evidence)
    assert "git -C custom_nodes/ComfyUI-IPAdapter-plus pull" in codes(half)


def test_a_webui_log_names_the_extension() -> None:
    log = ('  File "/home/u/stable-diffusion-webui/extensions/sd-webui-controlnet/scripts/hook.py", line 431, '
           "in forward\n    control = param.control_model(x=x_in, hint=hint)\n"
           "2023-08-10 10:39:16,532 | sd | INFO | launch | Starting SD.Next\n" + DEVICE)
    got = codes(top(log))
    assert "git -C extensions/sd-webui-controlnet pull" in got and not any("<name>" in c for c in got)


def test_rich_frames_and_builtin_extensions() -> None:
    """rich prints a frame as ``path:line in fn`` inside a box; a built-in extension ships with the app."""
    rich = ("│ /home/u/sdnext/extensions/sd-webui-agent-scheduler/agent_scheduler/task_runner.py:374 in execute │\n"
            + DEVICE)
    d = top(rich)
    assert "git -C extensions/sd-webui-agent-scheduler pull" in codes(d)
    assert "extensions/sd-webui-agent-scheduler/agent_scheduler/task_runner.py:374" in " ".join(t for t, _ in d.fixes)
    builtin = ('  File "/home/u/sdnext/extensions-builtin/Lora/networks.py", line 480, in network_forward\n'
               "2023-08-10 10:39:16,532 | sd | INFO | launch | Starting SD.Next\n" + DEVICE)
    got = codes(top(builtin))
    assert "git -C . pull" in got and not any("extensions-builtin/Lora pull" in c for c in got)


def test_without_a_plugin_frame_the_placeholder_stays() -> None:
    node = "/home/u/ComfyUI/custom_nodes/comfyui-color-tools/nodes.py"
    bare = NODE_FP64.replace(node, "/home/u/ComfyUI/nodes.py")
    d = top(bare.replace("Float but found Double", "Half but found Float"))
    assert "git -C custom_nodes/<node> pull" in codes(d)
