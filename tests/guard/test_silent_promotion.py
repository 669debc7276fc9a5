"""Issue 42 point 3 for guard: strict reports a silent dtype promotion (a bf16 model whose forward multiplies by an
fp32 plain attribute returns fp32, with no error) by path, with a proven fix; a forward's own intended upcast is not
reported."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import torchdoctor

BF = torch.bfloat16


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.scale = torch.ones(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


class _Norm(nn.Module):
    """T5's norm: the variance in float32 from an upcast copy, on purpose; the result cast back."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(var + 1e-6)
        return self.weight * x.to(self.weight.dtype)


def test_an_fp32_attribute_promoting_a_bf16_model_is_reported_by_path_with_a_proven_fix() -> None:
    model = _Scaled().to(BF)
    x = torch.randn(2, 8, dtype=BF)
    assert model(x).dtype == torch.float32  # what goes unnoticed without strict
    with pytest.raises(torchdoctor.PlacementError) as info:
        with torchdoctor.guard(model, mode="strict"):
            model(x)
    err = info.value
    assert "arg 1 (other) is float32 and promotes the model's bfloat16 to float32 silently" in str(err)
    assert "culprit scale = arg 1 (other): f32[8]@cpu  (expected bfloat16)" in str(err)
    assert err.fix == "model.scale.data = model.scale.data.to(torch.bfloat16)"
    assert err.proof == "fix proven: aten.mul.Tensor runs with arg 1 (other) -> bfloat16"
    assert [(p.path, p.found, p.expected) for p in err.problems] == [("scale", "float32", "bfloat16")]
    model.scale = model.scale.to(BF)  # the fix, applied
    with torchdoctor.guard(model, mode="strict"):
        assert model(x).dtype == BF


def test_an_intended_upcast_in_forward_is_not_a_promotion_problem() -> None:
    model = nn.Sequential(nn.Linear(8, 8), _Norm()).to(BF)
    with torchdoctor.guard(model, mode="strict") as g:
        assert model(torch.randn(2, 8, dtype=BF)).dtype == BF
    assert g.problems == []


# --- every mode (issue 42 point 3): explain and warn say it, fix mends it, strict stops at the promoting op ---------


class _Gated(nn.Module):
    """A tensor made in forward by a factory given no dtype (the default float32): its module's own tensors agree,
    so strict's module-boundary gate runs its ops unchecked; nothing fails, the output is float32."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.ones(x.shape[-1], device=x.device)
        return self.lin(x) * gate


class _Upcast(nn.Module):
    """Returns float32 on purpose (``logits.float()``): no op promotes anything."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).float()


def _run(model: nn.Module, mode: str) -> tuple[torch.Tensor, torchdoctor.guard, list[str]]:
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        with torchdoctor.guard(model, mode=mode) as g:
            out = model(torch.randn(2, 8, dtype=BF))
    return out, g, [str(w.message) for w in got if issubclass(w.category, torchdoctor.PlacementWarning)]


def test_explain_warns_of_a_promoting_attribute_by_path_with_the_proven_fix_and_changes_nothing() -> None:
    model = _Scaled().to(BF)
    out, g, said = _run(model, "explain")
    assert out.dtype == torch.float32 and model.scale.dtype == torch.float32  # read-only: the run is the user's
    assert len(said) == 1 and said[0].startswith("torchdoctor.guard: `_Scaled` returned float32, wider than the "
                                                 "model's bfloat16: a silent promotion\n")
    assert "at aten.mul.Tensor: arg 1 (other) is float32 and promotes the model's bfloat16" in said[0]
    assert "culprit scale = arg 1 (other): f32[8]@cpu  (expected bfloat16)" in said[0]
    assert [(p.path, p.found, p.expected) for p in g.problems] == [("scale", "float32", "bfloat16")]
    note = g.report().note(g.problems[0])
    assert note.fix == "model.scale.data = model.scale.data.to(torch.bfloat16)" and note.proven


def test_fix_mode_casts_the_promoting_attribute_for_the_op_and_the_output_keeps_the_models_dtype() -> None:
    model = _Scaled().to(BF)
    out, g, said = _run(model, "fix")
    assert out.dtype == BF and model.scale.dtype == torch.float32 and said == []
    assert [(f.path, f.found, f.expected, f.op) for f in g.fixes] == [
        ("scale", "float32", "bfloat16", "aten.mul.Tensor")]
    assert g.fixes[0].code == "model.scale.data = model.scale.data.to(torch.bfloat16)" and g.fixes[0].proven


def test_warn_mode_says_the_promotion_and_aligns_it() -> None:
    out, g, said = _run(_Scaled().to(BF), "warn")
    assert out.dtype == BF and len(said) == 1
    assert said[0].startswith("torchdoctor.guard: dtype problem in `<root>` at aten.mul.Tensor: scale is float32 and "
                              "promotes the model's bfloat16 silently; aligned for this call")
    assert "fix (proven): model.scale.data = model.scale.data.to(torch.bfloat16)" in said[0]


def test_a_default_dtype_factory_in_forward_is_named_by_its_maker_in_every_mode() -> None:
    line = "gate = torch.ones(x.shape[-1], device=x.device, dtype=torch.bfloat16)"
    out, g, said = _run(_Gated().to(BF), "explain")
    assert out.dtype == torch.float32 and len(said) == 1
    assert "arg 1 (other) made by `torch.ones` at " in said[0] and f"    {line}  # test_silent_promotion.py:" in said[0]
    with pytest.raises(torchdoctor.PlacementError) as info:  # strict with its gate: the mul ran unchecked
        _run(_Gated().to(BF), "strict")
    assert str(info.value).startswith("dtype problem in `<root>` (_Gated) at aten.mul.Tensor: arg 1 (other) is "
                                      "float32 and promotes the model's bfloat16")
    assert (info.value.fix or "").startswith(line) and (info.value.proof or "").startswith("fix proven")
    for mode in ("fix", "warn"):
        out, g, said = _run(_Gated().to(BF), mode)
        assert out.dtype == BF and [f.op for f in g.fixes] == ["aten.mul.Tensor"], mode
        assert (g.fixes[0].code or "").startswith(line) and g.fixes[0].proven
        assert len(said) == (mode == "warn")


@pytest.mark.parametrize("mode", ["explain", "strict", "fix", "warn"])
def test_an_output_cast_on_purpose_and_an_intended_upcast_are_quiet_in_every_mode(mode: str) -> None:
    for model in (_Upcast().to(BF), nn.Sequential(nn.Linear(8, 8), _Norm()).to(BF)):
        out, g, said = _run(model, mode)
        assert g.problems == [] and g.fixes == [] and said == [], type(model).__name__
    assert out.dtype == BF


def test_a_model_that_keeps_its_dtype_never_walks_or_reruns(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchdoctor._guard import outcome

    def never(*a: object, **k: object) -> None:
        raise AssertionError("re-run")

    monkeypatch.setattr(outcome.Outcome, "_rerun", never)
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
    for mode in ("explain", "strict"):
        with torchdoctor.guard(model, mode=mode):
            model(torch.randn(2, 8))
            model(torch.randn(2, 8))


def test_strict_stops_at_the_promoting_mul_not_at_the_addmm_that_refuses_its_result() -> None:
    class Lin(nn.Module):  # the hunt's r15: b(a(x) * torch.ones(...))
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            gate = torch.ones(x.shape[-1], device=x.device)
            return self.b(self.a(x) * gate)

    for every in (False, True):
        model = Lin().to(BF)
        with pytest.raises(torchdoctor.PlacementError) as info:
            with torchdoctor.guard(model, mode="strict", every_op=every):
                model(torch.randn(2, 8, dtype=BF))
        assert info.value.op == "aten.mul.Tensor" and "made by `torch.ones` at " in str(info.value), every


class _ScaledOnGpu(_Scaled):
    """What a GPU raises at ``lin(x) * scale`` when ``scale`` stayed on the CPU (devices are virtual here, as in
    test_guard.py's GPU texts)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _ = self.lin, self.scale  # what `self.lin(x) * self.scale` reads; no op runs on the tagged tensors
        raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and "
                           "cpu!")


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_a_tensor_wrong_in_device_and_dtype_gets_one_fix_for_both(mode: str) -> None:
    model = _ScaledOnGpu().to(BF)  # scale: float32 on the CPU in a bf16 model on cuda:0
    x = torch.randn(2, 8, dtype=BF)
    for t in (*model.lin.parameters(), x):
        t._td_device = torch.device("cuda:0")  # type: ignore[attr-defined]
    with pytest.raises(torchdoctor.PlacementError) as info, torchdoctor.guard(model, mode=mode):
        model(x)
    err = info.value
    assert [(p.kind, p.path, p.found, p.expected) for p in err.problems] == [("device", "scale", "cpu", "cuda:0")]
    # the device fix alone would leave a float32 attribute that promotes the bf16 model silently on the GPU
    assert err.fix == "model.scale.data = model.scale.data.to('cuda:0', torch.bfloat16)"
    assert "scale -> cuda:0 and bfloat16" in str(err)


class _Fp8PerCall(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype), self.bias.to(x.dtype))


@pytest.mark.parametrize("mode", ["explain", "strict", "fix", "warn"])
def test_a_float8_weight_cast_per_call_first_in_the_model_is_quiet(mode: str) -> None:
    """The hunt's G8: the output check compared the bf16 output with the first weight, float8, which torch refuses
    to promote with anything: the read-only check raised into a correct program."""
    model = nn.Sequential(_Fp8PerCall(8, 8), nn.Linear(8, 8)).to(BF)
    model[0].weight.data = model[0].weight.data.to(torch.float8_e4m3fn)
    out, g, said = _run(model, mode)
    assert out.dtype == BF and g.problems == [] and said == []


def test_explain_aims_at_the_callers_default_dtype_factory_that_promoted_the_input_as_strict_does() -> None:
    """The hunt's GN4 (musubi-tuner#431): a training step's sigmas made by ``torch.tensor`` with no dtype promote
    the bf16 latents; the model's first Linear refuses them. explain named the maker but printed ``# pass
    hidden_states as tensor.to(...)``; strict (at the promoting mul, outside any module) fixed the line."""
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8)).to(BF)
    latents = torch.randn(2, 4, 8, dtype=BF)
    line = "sigmas = torch.tensor([1.0, 0.5], dtype=torch.bfloat16).view(-1, 1, 1)"
    fixes = {}
    for mode in ("explain", "strict"):
        with pytest.raises(torchdoctor.PlacementError) as info, torchdoctor.guard(model, mode=mode):
            sigmas = torch.tensor([1.0, 0.5]).view(-1, 1, 1)
            model((1.0 - sigmas) * latents)
        fixes[mode] = (info.value.fix or "").split("  # ")[0]
        assert (info.value.proof or "").startswith("fix proven"), (mode, info.value.proof)
        assert info.value.patch is not None and f"+            {line}\n" in info.value.patch, mode
    assert fixes == {"explain": line, "strict": line}
