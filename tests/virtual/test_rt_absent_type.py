"""A program that asks for a device type the virtual machine does not have (``.to("cuda")`` on a virtual Mac or an
XPU machine) meets the error that machine's torch build raises, as plain torch on this CPU build raises it; the
machine's own type works."""

from __future__ import annotations

import pytest
import torch

import torchdoctor


def _real_error(call) -> tuple[type, str]:  # type: ignore[no-untyped-def]
    with pytest.raises(BaseException) as info:
        call()
    return type(info.value), str(info.value)


@pytest.mark.parametrize(("machine", "asked"), [("xpu", "cuda"), ("mps", "cuda"), ("cuda:0", "xpu")])
def test_a_device_type_the_machine_lacks_raises_as_its_build_does(machine: str, asked: str) -> None:
    want = _real_error(lambda: torch.ones(3).to(asked))  # this CPU build lacks it too: torch's own words
    with torchdoctor.virtual_devices(machine, raise_on_exit=False):
        assert _real_error(lambda: torch.ones(3).to(asked)) == want
        assert _real_error(lambda: torch.ones(3, device=asked)) == want
        here = torch.ones(3).to(machine)  # its own type is there
        assert here.device.type == torch.device(machine).type


def test_mps_lacking_cuda_says_torch_not_compiled_with_cuda() -> None:
    with torchdoctor.virtual_devices("mps", raise_on_exit=False):
        with pytest.raises(AssertionError, match="Torch not compiled with CUDA enabled"):
            torch.nn.Linear(2, 2).cuda()
