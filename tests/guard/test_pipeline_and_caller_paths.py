"""Issue 41 points 2 and 5 for guard: in a diffusers pipeline the float32 component beside bf16 neighbours is the
culprit (not the pipeline's inputs) and the fix casts or loads it, proven; a caller's tensor passed deep inside
keyword containers is named by its full argument path."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import torchdoctor

diffusers = pytest.importorskip("diffusers")
BF = torch.bfloat16


class _Pipe(diffusers.DiffusionPipeline):  # type: ignore[misc,name-defined]
    def __init__(self, unet: nn.Module, controlnet: nn.Module) -> None:
        super().__init__()
        self.register_modules(unet=unet, controlnet=controlnet)

    def __call__(self, sample: torch.Tensor, ehs: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        down, mid = self.controlnet(sample, 1, encoder_hidden_states=ehs, controlnet_cond=cond, return_dict=False)
        return self.unet(sample, 1, encoder_hidden_states=ehs, down_block_additional_residuals=down,
                         mid_block_additional_residual=mid).sample


@pytest.fixture(scope="module")
def pipe() -> _Pipe:
    unet = diffusers.UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4, out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=8, attention_head_dim=2, norm_num_groups=4)
    controlnet = diffusers.ControlNetModel.from_unet(unet, conditioning_embedding_out_channels=(4, 8))
    return _Pipe(unet.to(BF), controlnet)  # the ControlNet left in float32


def _inputs() -> tuple[torch.Tensor, ...]:
    return torch.randn(1, 4, 8, 8, dtype=BF), torch.randn(1, 3, 8, dtype=BF), torch.randn(1, 3, 16, 16, dtype=BF)


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_the_float32_controlnet_is_the_culprit_not_the_pipeline_inputs(pipe: _Pipe, mode: str) -> None:
    with pytest.raises(torchdoctor.PlacementError) as info:
        with torchdoctor.guard(pipe, mode=mode):
            pipe(*_inputs())
    err = info.value
    text = str(err)
    assert "culprit `controlnet`: computes in float32 while the rest of the pipeline feeds it bfloat16" in text
    assert "culprit input 0" not in text and "culprit kwargs" not in text  # the inputs only fed it
    assert (err.fix or "").startswith("pipe.controlnet.to(torch.bfloat16)  # or load it with torch_dtype=")
    assert err.problems[0].path == "controlnet" and err.problems[0].role == "component"
    assert err.proof is not None and err.proof.startswith("fix proven")
    assert pipe.controlnet.dtype == torch.float32  # the proof cast copies, never the component
    pipe.controlnet.to(BF)
    try:  # the printed fix, applied, makes the pipeline run
        with torchdoctor.guard(pipe, mode="strict"):
            assert pipe(*_inputs()).dtype == BF
    finally:
        pipe.controlnet.to(torch.float32)


@pytest.mark.parametrize("mode", ["fix", "warn"])
def test_fix_and_warn_tell_the_float32_controlnet_once_and_align_it_not_its_inputs(pipe: _Pipe, mode: str) -> None:
    """One cause, one problem: fix and warn name the component as strict does, and align its ops to the pipeline's
    dtype as the fix casts it, so that nothing downstream (the UNet fed float32 residuals) is a problem of its own."""
    with warnings.catch_warnings(record=True) as seen, torch.no_grad(), torchdoctor.guard(pipe, mode=mode) as g:
        warnings.simplefilter("always")
        out = pipe(*_inputs())
    told = [str(w.message) for w in seen if issubclass(w.category, torchdoctor.PlacementWarning)]
    assert out.dtype == BF
    assert [(p.path, p.role, p.found, p.expected) for p in g.problems] == [
        ("controlnet", "component", "float32", "bfloat16")]
    assert [(f.path, f.found, f.expected) for f in g.fixes] == [("controlnet", "float32", "bfloat16")]
    report = g.report().to_dict()["problems"]
    assert report[0]["fix"].startswith("pipe.controlnet.to(torch.bfloat16)") and report[0]["proven"]
    assert len(told) == (1 if mode == "warn" else 0)
    if told:
        assert "`controlnet` is float32 in a bfloat16 pipeline; load or cast it in bfloat16; aligned for this " \
               "call; fix (proven): pipe.controlnet.to(torch.bfloat16)" in told[0]
        assert "# pass" not in told[0] and "arg 1 (mat1) is" not in told[0]
    assert pipe.controlnet.dtype == torch.float32  # aligned per call, never the component itself


class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, **kwargs: object) -> torch.Tensor:
        return self.lin(x) @ kwargs["extra"][0]["bias"][1]  # type: ignore[index]


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _Inner()

    def forward(self, x: torch.Tensor, **kw: object) -> torch.Tensor:
        return self.inner(x, **kw)


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_a_caller_tensor_deep_in_keyword_containers_is_named_by_its_path(mode: str) -> None:
    model = _Outer().to(BF)
    odd = torch.randn(8, 8)
    with pytest.raises(torchdoctor.PlacementError) as info:
        with torchdoctor.guard(model, mode=mode):
            model(torch.randn(2, 8, dtype=BF), extra=[{"bias": [torch.ones(8, 8, dtype=BF), odd]}])
    text = str(info.value)
    assert "culprit kw['extra'][0]['bias'][1] (an argument of the _Outer call): f32[8,8]@cpu" in text
    # (its line would give it the dtype, but a re-run cannot pass keyword arguments to prove that: the argument's fix)
    assert "# pass kw['extra'][0]['bias'][1] as tensor.to(torch.bfloat16)" in (info.value.fix or "")
    assert "kw['extra'][0]['bias'][1] made by `torch.randn` at " in text  # the caller's line that made it
    assert "(`odd = torch.randn(8, 8)`)" in text
