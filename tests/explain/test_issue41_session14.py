"""explain on this session's hunt findings (issue 41 point 7): xformers' attention-bias device check (U8), the
torch.compile FakeTensor text whose printed call shows a CPU input (T25), and a ComfyUI log where a node hands a GPU
tensor to numpy at a line the paste shows (T28)."""

from __future__ import annotations

import html
import json

import pytest

from torchdoctor import explain

BIAS = "ValueError: Attention bias and Query/Key/Value should be on the same device"
FAKE = ("torch._dynamo.exc.TorchRuntimeError: Dynamo failed to run FX node with fake tensors: call_function <built-in "
        "function linear>(*(FakeTensor(..., size=(1, 10)), Parameter(FakeTensor(..., device='cuda:0', size=(20, 10), "
        "requires_grad=True)), Parameter(FakeTensor(..., device='cuda:0', size=(20,), requires_grad=True))), **{}): "
        "got RuntimeError('Unhandled FakeTensor Device Propagation for aten.addmm.default, found two different "
        "devices cpu, cuda:0')")
COMFY_NUMPY = '''got prompt
!!! Exception during processing !!! can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first.
Traceback (most recent call last):
  File "D:\\ComfyUI\\execution.py", line 327, in execute
    output_data, output_ui, has_subgraph = get_output_data(obj, input_data_all)
  File "D:\\ComfyUI\\custom_nodes\\comfyui_facesimilarity\\py\\face_similarity.py", line 10, in tensor2np
    npimage = image.numpy()
TypeError: can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first.

Prompt executed in 2.31 seconds
'''


@pytest.mark.parametrize("text", [BIAS, f"I get `{BIAS}` when I run it", json.dumps({"error": BIAS}),
                                  "<pre>" + html.escape(BIAS) + "</pre>",
                                  f"[ERROR] !!! Exception during processing !!! {BIAS.split(': ', 1)[1]}"])
def test_attention_bias_on_another_device_is_a_device_error_in_every_quoting(text: str) -> None:
    d = explain(text)[0]
    assert (d.category, d.signature) == ("device_mismatch", "device.attention_bias")
    assert "mask" in d.likely_causes[0] and "device='cuda'" in d.likely_causes[0]
    # (a ComfyUI log without a node's frame puts the app's own switches first, as for every device error)
    mask = next(code for _, code in d.fixes if code.startswith("mask = torch.full("))
    assert "device=q.device" in mask and (d.fixes[0][1] == mask or "ComfyUI" in d.fixes[0][0])


def test_fake_tensor_text_with_a_cpu_input_moves_the_input_first() -> None:
    d = explain(FAKE)[0]
    assert d.signature == "mixed.fake_tensor"
    assert "FakeTensor(..., size=(1, 10))" in d.likely_causes[0] and "on cuda:0" in d.likely_causes[0]
    assert d.fixes[0] == ("Move the input to the model's device before calling the compiled model",
                          'x = x.to("cuda:0")')


def test_fake_tensor_text_without_the_call_keeps_the_constants_fix() -> None:
    d = explain("RuntimeError: Unhandled FakeTensor Device Propagation for aten.mul.Tensor, found two different "
                "devices cpu, cuda:0")[0]
    assert d.fixes[0][0] == "Create constants on the input's device"
    assert not any("never moved to the model's device" in c for c in d.likely_causes)


def test_numpy_of_a_gpu_tensor_in_a_custom_node_is_fixed_at_the_nodes_line() -> None:
    d = explain(COMFY_NUMPY)[0]
    assert d.signature == "device.numpy"
    assert d.fixes[0] == ("Copy it to the CPU where the code converts it (face_similarity.py:10)",
                          "npimage = image.cpu().numpy()  # face_similarity.py:10")
    # the node's tensor is on the GPU and numpy needs the CPU: no "node keeps its module on the CPU" cause, and no
    # app flag about loading models to the GPU
    assert len(d.likely_causes) == 1 and "numpy needs a CPU copy" in d.likely_causes[0]
    assert not any("--gpu-only" in code or "--highvram" in code for _, code in d.fixes)
    assert any("git -C custom_nodes/comfyui_facesimilarity pull" == code for _, code in d.fixes)


def test_numpy_without_the_code_line_keeps_the_generic_fix() -> None:
    d = explain("TypeError: can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                "to host memory first.")[0]
    assert d.fixes[0] == ("Copy to the CPU first", "arr = t.detach().cpu().numpy()")


UNSCALE_BF16 = "RuntimeError: \"_amp_foreach_non_finite_check_and_unscale_cuda\" not implemented for 'BFloat16'"


@pytest.mark.parametrize("text", [UNSCALE_BF16, f"I get `{UNSCALE_BF16}`", json.dumps({"error": UNSCALE_BF16}),
                                  "<pre>" + html.escape(UNSCALE_BF16) + "</pre>"])
def test_grad_scaler_over_bf16_gradients_is_told_to_drop_the_scaler(text: str) -> None:
    """Hunt U18: not a missing kernel to work around on the CPU, but a GradScaler over bfloat16 weights."""
    d = explain(text)[0]
    assert (d.signature, d.category) == ("dtype.unscale_bf16", "dtype_mismatch")
    assert d.fixes[0][1].startswith("scaler = torch.amp.GradScaler(enabled=False)")
    assert "needs no loss scaling" in d.likely_causes[0] and "CPU" not in d.likely_causes[0]
    assert d.confirm_with == 'torchdoctor.scan(model, dtype="bfloat16")'
