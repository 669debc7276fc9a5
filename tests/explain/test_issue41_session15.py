"""Hunt findings of session 15 in explain (issue 41 point 7), each pinned on the text that showed it."""

from __future__ import annotations

from torchdoctor import explain

# unsloth#4041 and peft#3043 (2026-02): models split over two GPUs, no quantization anywhere in the text
TWO_GPUS = "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:1 and cuda:0!"
TWO_GPUS_BMM = ("RuntimeError: Expected all tensors to be on the same device, but got mat2 is on cuda:0, different from "
                "other tensors on cuda:1 (when checking argument in method wrapper_CUDA_bmm)")
BNB_FRAME = '  File "/site-packages/bitsandbytes/autograd/_functions.py", line 462, in forward\n'


def test_two_gpus_alone_are_not_read_as_quantization() -> None:
    """U9: two GPUs in a message said nothing of quantization, yet quantization_device came second at 0.90 beside
    0.95; it stays an alternative, well below the reading."""
    for text in (TWO_GPUS, TWO_GPUS_BMM):
        d = explain(text)[0]
        assert d.category == "device_mismatch" and d.confidence >= 0.9
        alt = {a.category: a.confidence for a in d.alternatives}
        assert alt["quantization_device"] <= 0.6, alt
        assert d.confidence - alt["quantization_device"] >= 0.3


def test_bitsandbytes_frames_over_two_gpus_still_read_as_quantization() -> None:
    """The frames are what make it quantization: bitsandbytes in the traceback of a two-GPU error."""
    d = explain("Traceback (most recent call last):\n" + BNB_FRAME + TWO_GPUS)[0]
    assert d.category == "quantization_device"
