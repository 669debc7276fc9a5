"""A torch.Generator asked for on a device this torch makes none for is explained as such, with a cpu generator as
the fix: the real text this CPU build raises for ``torch.Generator(device="mps")``, and the older Mac torch's
"Device type MPS is not supported for torch.Generator() api." in every quoting."""

from __future__ import annotations

import json

import pytest
import torch

import torchdoctor


def _real_text() -> str:
    try:
        torch.Generator(device="mps")
    except RuntimeError as e:
        return f"RuntimeError: {e}"
    pytest.skip("this torch makes an mps generator")


@pytest.mark.parametrize("text", [
    "real",
    "RuntimeError: Device type MPS is not supported for torch.Generator() api.",
    "`Device type MPS is not supported for torch.Generator() api`",
    json.dumps({"error": "RuntimeError: Device type MPS is not supported for torch.Generator() api."}),
])
def test_a_generator_on_a_device_without_one_is_explained_with_a_cpu_generator(text: str) -> None:
    said = _real_text() if text == "real" else text
    out = torchdoctor.explain(said).to_dict()
    top = out["diagnoses"][0]
    assert top["category"] == "no_accelerator", out
    assert "A random generator on a device this torch cannot make one for" in top["title"]
    assert "MPS" in str(out)
    assert "torch.Generator(device='cpu').manual_seed(seed)" in str(out)
