"""``torch.cuda.is_bf16_supported()`` answered as torch answers it on the profile's card: True below sm80 too (a bf16
tensor can be made there, the check torch runs unless asked for native support), False only for
``including_emulation=False``. Programs and transformers gate their bf16 branch on the bare call, so a virtual T4
must take the branch a real T4 takes."""

from __future__ import annotations

import pytest
import torch

import torchdoctor


@pytest.mark.parametrize(("profile", "native"), [("t4", False), ("v100", False), ("a100", True)])
def test_bf16_supported_with_and_without_emulation(profile: str, native: bool) -> None:
    with torchdoctor.virtual_devices("cuda:0", profile=profile):
        assert torch.cuda.is_bf16_supported() is True
        assert torch.cuda.is_bf16_supported(including_emulation=False) is native
