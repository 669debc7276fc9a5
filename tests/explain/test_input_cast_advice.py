""""Input type (X) and bias type (Y) should be the same" where the layer's part is kept in Y on purpose (a VAE
upcast by force_upcast, a VAE loaded at the app's dtype) is fixed at the call that feeds it
(``vae.decode(latents.to(vae.dtype))``): explain offers that beside casting the layer, whichever side is which."""

from __future__ import annotations

import pytest

import torchdoctor


@pytest.mark.parametrize(("text", "cast"), [
    ("RuntimeError: Input type (c10::Half) and bias type (float) should be the same", "torch.float32"),
    ("RuntimeError: Input type (c10::BFloat16) and bias type (c10::Half) should be the same", "torch.float16"),
    ("RuntimeError: Input type (struct c10::BFloat16) and bias type (float) should be the same", "torch.float32"),
])
def test_the_input_cast_to_a_part_kept_in_its_dtype_is_offered(text: str, cast: str) -> None:
    out = str(torchdoctor.explain(text))
    assert "kept in" in out and "on purpose" in out, out
    assert f"out = part(x.to({cast}))  # e.g. vae.decode(latents.to(vae.dtype))" in out, out
    assert out.index("layer.to(") < out.index("out = part("), out  # casting the layer stays the first fix


def test_a_float32_input_into_a_16_bit_layer_is_cast_first() -> None:
    out = str(torchdoctor.explain("`RuntimeError: Input type (float) and weight type (c10::BFloat16) should be the same`"))
    fixes = out.split("fixes:", 1)[1]
    assert fixes.lstrip().startswith("- Cast the input to the layer's dtype (bfloat16; the input is float32)"), out
    assert "x = x.to(torch.bfloat16)" in fixes
