"""One remedy in every mode: the fix warn prints for a layer's weight or bias left in another dtype is the fix strict
raises with (the tensor cast where the model holds it), never ``# pass arg 0 (self) ...``: the operand that holds
the wrong value is the model's own tensor, not something the caller passes."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import torchdoctor

BF = torch.bfloat16


def _model(which: str) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    t = getattr(m[2], which)
    t.data = t.data.to(BF)  # one tensor of the last layer left in another dtype
    return m


def _strict_fix(which: str) -> str:
    m = _model(which)
    with pytest.raises(torchdoctor.PlacementError) as info, torchdoctor.guard(m, mode="strict"):
        m(torch.randn(3, 4))
    assert (info.value.proof or "").startswith("fix proven")
    return info.value.fix or ""


@pytest.mark.parametrize("which", ["weight", "bias"])
def test_warn_prints_the_fix_strict_raises_with(which: str) -> None:
    want = f"model[2].{which}.data = model[2].{which}.data.to(torch.float32)"
    assert _strict_fix(which) == want
    m = _model(which)
    with warnings.catch_warnings(record=True) as seen, torchdoctor.guard(m, mode="warn") as g:
        warnings.simplefilter("always")
        out = m(torch.randn(3, 4))
    told = [str(w.message) for w in seen if issubclass(w.category, torchdoctor.PlacementWarning)]
    assert len(told) == 1 and told[0].endswith(f"fix (proven): {want}"), told
    assert "# pass" not in told[0] and f"2.{which} is bfloat16, expected float32" in told[0]
    assert out.dtype == torch.float32 and getattr(m[2], which).dtype == BF  # aligned per call, the model untouched
    assert [(f.path, f.code) for f in g.fixes] == [(f"2.{which}", want)]
    exec(want, {"torch": torch, "model": m})  # the printed fix, applied: the model runs clean under strict
    with torchdoctor.guard(m, mode="strict"):
        assert m(torch.randn(3, 4)).dtype == torch.float32


class _ConvHead(nn.Module):
    def __init__(self, bias: bool = True) -> None:
        super().__init__()
        self.conv, self.lin = nn.Conv2d(3, 4, 3, bias=bias), nn.Linear(4, 4)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        return self.lin(self.conv(img).mean((2, 3)))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("mode", ["explain", "strict", "warn"])
def test_one_large_weight_left_bf16_is_the_culprit_not_the_float32_rest(mode: str, bias: bool) -> None:
    """One conv weight left in bf16 holds most of a small float32 model's elements: it is still the odd one (as scan
    says), never the float32 bias, the caller's input and the next layer cast to bf16. Elements speak for the
    model's dtype only for a frozen base beside trainable adapters."""
    m = _ConvHead(bias)
    m.conv.weight.data = m.conv.weight.data.to(BF)
    want = "model.conv.weight.data = model.conv.weight.data.to(torch.float32)"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            with torchdoctor.guard(m, mode=mode):
                m(torch.randn(2, 3, 8, 8))
            fix, text = None, "\n".join(str(w.message) for w in seen)
        except torchdoctor.PlacementError as e:
            fix, text = e.fix, str(e)
    assert "conv.bias" not in text and "pass img" not in text and "lin.weight" not in text, text
    assert fix == want if mode != "warn" else text.count("fix (proven): " + want) == 1, text


class _TextEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.lin = nn.Embedding(32, 16), nn.Linear(16, 16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lin(self.emb(ids))


class _Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.caption_proj, self.out = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        return self.out(x + self.caption_proj(ctx).mean(1, keepdim=True))


@pytest.mark.parametrize("mode", ["explain", "strict", "fix", "warn"])
def test_a_float16_component_feeding_a_bf16_one_is_the_culprit_not_the_data_it_hands_on(mode: str) -> None:
    """An fp16 text encoder's output reaches a bf16 transformer: the text encoder is named and cast, never
    ``# pass arg 1 (mat1) as tensor.to(...)`` (the data is made inside the guarded object, not passed by the user)."""
    torch.manual_seed(0)
    te, tr = _TextEncoder().to(torch.float16), _Transformer().to(BF)
    parts = {"text_encoder": te, "transformer": tr}
    want = "pipe.text_encoder.to(torch.bfloat16)  # or load it with torch_dtype=torch.bfloat16"

    def call() -> torch.Tensor:
        return tr(torch.randn(2, 4, 16, dtype=BF), te(torch.randint(0, 32, (2, 5))))

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            with torchdoctor.guard(parts, mode=mode) as g:
                assert call().dtype == BF
            fix, text = None, "\n".join(str(w.message) for w in seen)
        except torchdoctor.PlacementError as e:
            fix, text = e.fix, str(e)
    assert "# pass" not in text and "pass arg" not in (fix or ""), text
    if mode in ("explain", "strict"):
        assert fix == want and "culprit `text_encoder`: every tensor in it is float16 while the rest of the " \
            "pipeline is bfloat16" in text, text
    else:
        assert [(p.path, p.role) for p in g.problems] == [("text_encoder", "component")]
        assert [f.code for f in g.fixes] == [want]
        assert text.count(want) == (1 if mode == "warn" else 0), text
