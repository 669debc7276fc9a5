"""Session 14's hunt, guard: a line's fix is proven only when the rest of its line keeps it (U29), and an int-literal
``torch.tensor`` on the call line is never named as the maker of a float32 argument (U20)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdoctor

BF = torch.bfloat16


def _dequant_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    original_dtype = self.scale_weight.dtype
    dequantized_weight = self.weight.to(original_dtype) * self.scale_weight
    return F.linear(x, dequantized_weight, self.bias.to(x.dtype))


def _fp8_scaled(lin: nn.Linear) -> nn.Linear:
    w = lin.weight.data.float()
    s = w.abs().amax() / 448.0
    lin.weight.data = (w / s).to(torch.float8_e4m3fn)
    lin.register_buffer("scale_weight", s.reshape(1).float())  # float32 by design: the dequant multiplies by it
    lin.forward = _dequant_forward.__get__(lin)  # type: ignore[method-assign]
    return lin


def _float_bias_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    original_dtype = self.scale_weight.dtype
    dequantized_weight = self.weight.to(original_dtype) * self.scale_weight
    return F.linear(x, dequantized_weight, self.bias.float())


def test_a_cast_the_rest_of_its_line_undoes_is_never_proven() -> None:
    """musubi-tuner's fp8_scaled dequant: `self.weight.to(original_dtype) * self.scale_weight`. Casting the `.to`
    to bf16 alone still leaves a float32 weight after the multiply by the float32 scale: that fix is never proven.
    Assigned to a local, the line's whole value cast is (tests/guard/test_hunt_s15_guard.py); with a float32 bias
    beside it, neither proves: unproven, with the error, and no patch (a diff that does not fix is never offered)."""
    torch.manual_seed(0)
    model = nn.Sequential(_fp8_scaled(nn.Linear(8, 16).to(BF)))
    with pytest.raises(torchdoctor.PlacementError) as info, torch.no_grad(), torchdoctor.guard(model, mode="strict"):
        model(torch.randn(1, 8, dtype=BF))
    err = info.value
    assert "made by `.to(original_dtype)` at " in str(err)
    assert err.proof is not None and err.proof.startswith("fix proven: Linear runs again with `dequantized_weight` "
                                                          "cast where it is assigned at test_hunt_s14_guard.py:")
    model[0].forward = _float_bias_forward.__get__(model[0])
    with pytest.raises(torchdoctor.PlacementError) as info, torch.no_grad(), torchdoctor.guard(model, mode="strict"):
        model(torch.randn(1, 8, dtype=BF))
    err = info.value
    assert "arg 0 (self) made by `.float()` at " in str(err)
    assert err.proof is not None and err.proof.startswith("fix unproven: re-ran Linear with `.float()` at "
                                                          "test_hunt_s14_guard.py:")
    assert "fix proven" not in str(err) and err.patch is None


class _Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(8, 8, 3, padding=1)
        self.emb = nn.Embedding(8, 8)

    def forward(self, input_features: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.conv(input_features).mean(-1) + self.emb(ids).mean(1)


def _features() -> dict[str, torch.Tensor]:
    return {"input_features": torch.rand(1, 8, 16)}  # a feature extractor's float32 output


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_an_int_literal_tensor_on_the_call_line_is_not_the_float_arguments_maker(mode: str) -> None:
    torch.manual_seed(0)
    model = _Encoder().to(BF)
    feats = _features()["input_features"]
    with pytest.raises(torchdoctor.PlacementError) as info, torch.no_grad(), torchdoctor.guard(model, mode=mode):
        model(input_features=feats, ids=torch.tensor([[1, 5]]))
    said = str(info.value)
    assert "culprit input_features (an argument of the _Encoder call): f32[1,8,16]@cpu  (expected bfloat16)" in said
    assert "made by `torch.tensor`" not in said


class _WeightNormed(nn.Module):
    """An audio VAE's convolutions under weight_norm: `weight` is remade from weight_g / weight_v by the module's own
    pre-hook on every call, so the attribute is stale (float32 after `.to(float16)`) until that hook runs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.utils.weight_norm(nn.Conv1d(2, 4, 7, padding=3))
        self.conv2 = torch.nn.utils.weight_norm(nn.Conv1d(4, 4, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(torch.relu(self.conv1(x)))


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_a_weight_norm_weight_remade_per_call_is_never_the_culprit(mode: str) -> None:
    """hunt U23 (stable-audio's fp32 init audio into an fp16 AutoencoderOobleck): the input is the culprit."""
    torch.manual_seed(0)
    with pytest.warns(FutureWarning):  # torch.nn.utils.weight_norm is deprecated, still what the library calls
        model = _WeightNormed().to(torch.float16)
    with pytest.raises(torchdoctor.PlacementError) as info, torch.no_grad(), torchdoctor.guard(model, mode=mode):
        model(torch.randn(1, 2, 16))
    err = info.value
    assert "culprit x (an argument of the _WeightNormed call): f32[1,2,16]@cpu  (expected float16)" in str(err)
    assert [p.path for p in err.problems if p.role == "parameter"] == []
    assert ".weight.data" not in (err.fix or "")
