"""Issue 41 point 7, session 16: the tenth collection (101 real pastes of 2025-2026, held out whole) and the four
families its first run missed, each pinned on the text that showed it and on a sibling wording of the family."""

from __future__ import annotations

import pathlib

from torchdoctor import explain

from support.holdout import HELD, meta as _meta, ranked as _ranked


def test_tenth_collection_accuracy() -> None:
    """Labelled before explain ran on any of it, each text with its thread's URL. Measured before any change: 95 of
    101 first, 96 in the top two. After the four families below: 99 first, 100 in the top two; left: a title in
    prose only ("raises RuntimeError on CPU for float16 inputs") and a bf16 input meeting an fp16 bias (the layer's
    cast first, the operand's second, as for two texts of the ninth collection)."""
    tenth = [(m, b) for m, b in map(_meta, HELD) if m.get("collection") == "10"]
    assert len(tenth) >= 100 and len({m["source"].partition("#")[0] for m, _ in tenth}) >= 75
    assert all(m["url"].startswith("https://github.com/") for m, _ in tenth)
    ranked = [(m["category"], _ranked(b)) for m, b in tenth]
    top1 = sum(r[:1] == [c] for c, r in ranked) / len(ranked)
    top2 = sum(c in r[:2] for c, r in ranked) / len(ranked)
    assert top1 >= 0.98 and top2 >= 0.99, (top1, top2)


def test_a_kernel_message_retold_in_words() -> None:
    """bytedance/Dolphin#95: the title retells '"slow_conv2d_cpu" not implemented for 'Half'' without quotes or
    underscores; nothing was recognised. The kernel must stand right before the phrase: prose about half precision
    alone is not read."""
    d = explain("Slow conv2d cpu not implemented in half.\n\nWill it only run on gpu based devices .")[0]
    assert d.category == "unsupported_dtype_on_device" and d.signature == "unsupported.kernel_words"
    assert "Slow conv2d cpu" in d.what_happened and "float16" in d.what_happened
    assert any(code == "model = model.float()" for _, code in d.fixes)
    d = explain('RuntimeError: "addmm_impl_cpu_" not implemented for Half')[0]  # the kernel quoted, the dtype not
    assert d.category == "unsupported_dtype_on_device" and "addmm_impl_cpu_" in d.what_happened
    d = explain("RuntimeError: LayerNormKernelImpl not implemented for BFloat16")[0]
    assert d.category == "unsupported_dtype_on_device" and "LayerNormKernelImpl" in d.what_happened
    assert not explain("is flash attention not implemented for half precision yet? just asking")


def test_a_dtype_the_build_refuses_on_its_platform() -> None:
    """Comfy-Org/ComfyUI#10388: torch 2.9+rocm6.4 refuses float8 outright; nothing was recognised."""
    text = ("Now when running an fp8 model, say wan 2.2 for example. I get this\n\n"
            "RuntimeError: Float8_e4m3fn is only supported for ROCm 6.5 and above")
    d = explain(text)[0]
    assert d.category == "unsupported_dtype_on_device" and d.signature == "unsupported.dtype_platform"
    assert "ROCm 6.5" in d.what_happened and "float8_e4m3fn" in d.what_happened.lower()
    assert d.fixes[0][1] == "model = model.to(torch.bfloat16)"


def test_the_fft_libraries_missing_dtypes() -> None:
    """modelscope/DiffSynth-Studio#1423: cuFFT has no bfloat16; nothing was recognised. The half-precision size
    limit is the same family."""
    d = explain("`RuntimeError: cuFFT doesn't support tensor of type: BFloat16`")[0]
    assert d.category == "unsupported_dtype_on_device" and d.signature == "unsupported.fft_dtype"
    assert "bfloat16" in d.what_happened.lower()
    assert any("torch.fft.rfft(x.float())" in code for _, code in d.fixes)
    d = explain("RuntimeError: cuFFT only supports dimensions whose sizes are powers of two when computing in half "
                "precision, but got a signal size of[1000]")[0]
    assert d.signature == "unsupported.fft_dtype"


def test_device_kernel_image_is_invalid() -> None:
    """deepbeepmeep/HunyuanVideoGP#47: an RTX 5060 Ti with a torch built without its architecture; CUDA words it
    as "device kernel image is invalid" beside "no kernel image is available"; nothing was recognised."""
    d = explain("RuntimeError: CUDA error: device kernel image is invalid (RTX 5060Ti 16gb)")[0]
    assert d.category == "no_accelerator" and d.signature == "no_accel.arch"
    assert any("cu128" in code for _, code in d.fixes)
