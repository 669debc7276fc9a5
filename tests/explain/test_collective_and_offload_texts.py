"""explain on three families of 2025-2026 reports that nothing recognised: gloo refusing a device's tensors in a
collective (DDP on a Mac), diffusers' model offload with no accelerator, and a dtype "not supported" on MPS said in
a title. The first two are raised here by the libraries themselves on the CPU."""

from __future__ import annotations

import html
import json
import os
import tempfile
import traceback

import pytest
import torch
import torch.distributed as dist

from torchdoctor import explain

from support.holdout import first as _first


def _quotings(text: str) -> dict[str, str]:
    return {"plain": text, "json": json.dumps({"error": text}), "html": "<pre>" + html.escape(text) + "</pre>",
            "quote": "\n".join("> " + line for line in text.split("\n")), "backticks": "`" + text + "`",
            "crlf": text.replace("\n", "\r\n"), "repr": repr(text), "rank": "[rank1]: " + text}


def _gloo_error() -> BaseException:
    """gloo's own check, raised for real: an all_gather whose output list holds a tensor gloo cannot move (meta here;
    mps or xpu on a Mac or an Intel GPU)."""
    store = tempfile.NamedTemporaryFile(delete=False)
    store.close()
    dist.init_process_group("gloo", init_method=f"file://{store.name}", rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError) as info:
            dist.all_gather([torch.zeros(2, dtype=torch.long, device="meta")], torch.zeros(2, dtype=torch.long))
        return info.value
    finally:
        dist.destroy_process_group()
        os.unlink(store.name)


def test_gloo_refusing_a_devices_tensors() -> None:
    exc = _gloo_error()
    message = str(exc)
    assert message.startswith("ProcessGroupGloo::allgather: invalid tensor type")
    # a meta tensor there is an unmaterialised model (filed with the meta family), mps / xpu a device gloo cannot move
    assert _first("RuntimeError: " + message) == ("mixed_device_model", "device.collective_backend")
    for dev in ("mps:0", "xpu:0"):
        text = "RuntimeError: " + message.replace("device=meta", f"device={dev}")
        for how, quoted in _quotings(text).items():
            assert _first(quoted) == ("device_mismatch", "device.collective_backend"), how
    d = explain("RuntimeError: " + message.replace("device=meta", "device=mps:0"))[0]
    assert "mps:0" in d.what_happened and "gloo" in d.likely_causes[0]
    assert _first("".join(traceback.format_exception(exc)))[1] == "device.collective_backend"


@pytest.mark.parametrize("text", [
    "RuntimeError: ProcessGroupGloo::allreduce: unsupported device type flagos",
    "RuntimeError: No backend type associated with device type mps",
])
def test_other_wordings_of_a_collective_on_an_unserved_device(text: str) -> None:
    assert _first(text) == ("device_mismatch", "device.collective_backend")


def _offload_errors() -> list[BaseException]:
    from diffusers import ConfigMixin, DiffusionPipeline, ModelMixin
    from diffusers.configuration_utils import register_to_config

    class Tiny(ModelMixin, ConfigMixin):  # type: ignore[misc]
        @register_to_config  # type: ignore[misc]
        def __init__(self, n: int = 2) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(n, n)

    class Pipe(DiffusionPipeline):  # type: ignore[misc]
        model_cpu_offload_seq = "unet"

        def __init__(self, unet: Tiny) -> None:
            super().__init__()
            self.register_modules(unet=unet)

    pipe, errors = Pipe(Tiny()), []
    for switch_on in (pipe.enable_model_cpu_offload, pipe.enable_sequential_cpu_offload):
        with pytest.raises(RuntimeError) as info:
            switch_on()
        errors.append(info.value)
    return errors


def test_diffusers_offload_without_an_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    """diffusers' own check on this CPU-only machine (its device probe forced to 'cpu', should a GPU be present)."""
    import diffusers.pipelines.pipeline_utils as pipeline_utils

    monkeypatch.setattr(pipeline_utils, "get_device", lambda: "cpu")
    for exc in _offload_errors():
        assert "requires accelerator, but not found" in str(exc)
        paste = "".join(traceback.format_exception(exc))
        for how, quoted in _quotings(paste).items():
            assert _first(quoted) == ("no_accelerator", "noaccel.diffusers_offload"), how
        assert "torch.cuda.is_available()" in explain(paste)[0].text()


@pytest.mark.parametrize("text", [
    "LTX Video VAE: TypeError on MPS (Apple Silicon) - float64 not supported",
    "float64 is not supported on XPU (Arc A750), cast the rotary table to float32",
])
def test_a_dtype_not_supported_said_in_a_title(text: str) -> None:
    assert _first(text) == ("unsupported_dtype_on_device", "partial.dtype_device_words")


def test_the_message_outranks_the_title() -> None:
    text = ("float64 not supported on MPS\nTypeError: Cannot convert a MPS Tensor to float64 dtype as the MPS "
            "framework doesn't support float64. Please use float32 instead.")
    assert _first(text)[1] == "unsupported.mps_fp64"
