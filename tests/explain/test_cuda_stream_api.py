"""A CUDA-only stream API (``torch.cuda.Stream()``) called on a torch without CUDA (an Intel GPU's xpu build, a Mac,
a CPU build) is a no_accelerator error whose fix is the same streams and events for every device (hunt Z11:
smthemex/ComfyUI_SenseNova_U1#15, a layer streamer on an Arc card). The texts are torch's own: read from its source,
so a torch that rewords them fails here first."""

from __future__ import annotations

import inspect

import torch
import torch._utils
import torch.cuda.streams

import torchdoctor


def test_torch_cuda_stream_without_cuda_is_told_with_the_device_generic_api() -> None:
    said = "torch.cuda.Stream requires CUDA support"
    assert said in inspect.getsource(torch.cuda.streams)
    for text in (f"RuntimeError: {said}", "RuntimeError: Tried to instantiate dummy base class Event"):
        d = torchdoctor.explain(text)[0]
        assert (d.category, d.signature, d.title) == ("no_accelerator", "no_accel.cuda_api",
                                                      "A CUDA-only API on a torch without CUDA"), text
        assert d.fixes[0][1].startswith("stream = torch.Stream(device=device)  # was torch.cuda.Stream()")
        assert "torch.accelerator.synchronize()" in d.fixes[0][1]
    assert "Tried to instantiate dummy base class" in inspect.getsource(torch._utils)


def test_the_device_generic_api_it_names_exists_in_this_torch() -> None:
    assert all(callable(f) for f in (torch.Stream, torch.Event, torch.accelerator.current_stream,
                                     torch.accelerator.synchronize))
    assert hasattr(torch.Stream, "__enter__") and hasattr(torch.Stream, "__exit__")  # `with stream:`
