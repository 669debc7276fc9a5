"""pin_memory() of a tensor already on an accelerator (session 31's whole-program hunt): ATen's ``_pin_memory``
refuses it with "cannot pin 'CUDAFloatType' only dense CPU tensors can be pinned" (torch 1.x wrote the legacy type,
``torch.cuda.FloatTensor``). The virtual run raises the same text (``_virtual/host.py``), and explain names it."""

from __future__ import annotations

import pytest

from torchdoctor._explain.api import explain


@pytest.mark.parametrize("text", [
    "RuntimeError: cannot pin 'CUDAFloatType' only dense CPU tensors can be pinned",
    "RuntimeError: cannot pin 'torch.cuda.FloatTensor' only dense CPU tensors can be pinned",
    "  File \"train.py\", line 40, in <module>\n    batch = batch.pin_memory()\n"
    "RuntimeError: cannot pin 'XPUHalfType' only dense CPU tensors can be pinned",
])
def test_a_pinned_accelerator_tensor_is_a_device_error_with_its_advice(text: str) -> None:
    [d, *_] = explain(text)
    assert d.category == "device_mismatch" and d.signature == "device.pin_not_cpu", d
    assert "only a dense CPU tensor can be pinned" in d.what_happened
    assert any("pin_memory().to(device, non_blocking=True)" in code for _, code in d.fixes)


def test_a_pin_memory_flag_in_prose_is_not_that_error() -> None:
    assert not [d for d in explain("we set pin_memory=True in the DataLoader and training got faster")
                if d.signature == "device.pin_not_cpu"]
