"""Pipelines: scan judges where components feed each other (issue 25). A component whose compute dtype differs
from the pipeline's (its denoiser's) is a problem at that component, with the fix that names it, unless the
pipeline's own code casts at that boundary. Real tiny diffusers pipelines; each verdict checked against the run."""

from __future__ import annotations

import warnings

import pytest
import torch

import torchdoctor
from support import zoo

BF16 = torch.bfloat16


def _run(pipe) -> None:
    pipe("a cat", num_inference_steps=1, height=16, width=16, output_type="np")


@pytest.fixture
def sd_bf16():
    pipe = zoo.tiny_sd_pipeline()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe.to(BF16)
    return pipe


def test_a_bf16_pipeline_is_quiet_and_runs(sd_bf16) -> None:
    assert torchdoctor.scan(sd_bf16).ok
    _run(sd_bf16)


@pytest.mark.parametrize("name", ["vae", "text_encoder"])
def test_an_fp32_component_the_pipeline_does_not_cast_is_named_with_its_fix(sd_bf16, name: str) -> None:
    getattr(sd_bf16, name).to(torch.float32)  # each component votes its own dtype: per tensor all is "ok"
    with pytest.raises(RuntimeError):
        _run(sd_bf16)  # what StableDiffusionPipeline does with it: no cast at that boundary
    report = torchdoctor.scan(sd_bf16)
    assert [(p.kind, p.path, p.found, p.expected) for p in report.problems] == [
        ("dtype", name, "float32", "bfloat16")]
    assert f"pipe.{name}.to(torch.bfloat16)" in report.problems[0].message
    assert "torch_dtype=torch.bfloat16" in report.problems[0].message
    getattr(sd_bf16, name).to(BF16)  # the printed fix, applied: quiet, and the pipeline runs
    assert torchdoctor.scan(sd_bf16).ok
    _run(sd_bf16)


def test_the_denoiser_alone_in_another_dtype_is_the_component_named(sd_bf16) -> None:
    """Its neighbours (text encoder, VAE) agree on bf16: the fp32 UNet is the odd one, never its neighbours."""
    sd_bf16.unet.to(torch.float32)
    with pytest.raises(RuntimeError):
        _run(sd_bf16)
    report = torchdoctor.scan(sd_bf16)
    assert [(p.kind, p.path, p.found, p.expected) for p in report.problems] == [
        ("dtype", "unet", "float32", "bfloat16")]
    msg = report.problems[0].message
    assert "the components it meets (text_encoder, vae) compute in bfloat16" in msg
    assert "pipe.unet.to(torch.bfloat16)" in msg and "UNet2DConditionModel.from_pretrained(" in msg
    sd_bf16.unet.to(BF16)  # the printed fix, applied
    assert torchdoctor.scan(sd_bf16).ok
    _run(sd_bf16)
    sd_bf16.unet.to(torch.float32)
    sd_bf16.vae.to(torch.float32)  # one neighbour against the denoiser: the denoiser's dtype is the pipeline's
    assert [p.path for p in torchdoctor.scan(sd_bf16).problems] == ["text_encoder"]


def test_controlnet_left_fp32_in_a_bf16_controlnet_pipeline() -> None:
    """diffusers #9527 / #4860 shape: a ControlNet loaded without torch_dtype beside a bf16 pipeline."""
    from diffusers import ControlNetModel, StableDiffusionControlNetPipeline

    base = zoo.tiny_sd_pipeline()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        controlnet = ControlNetModel.from_unet(base.unet, conditioning_embedding_out_channels=(4, 8))
        pipe = StableDiffusionControlNetPipeline(
            vae=base.vae, text_encoder=base.text_encoder, tokenizer=base.tokenizer, unet=base.unet,
            controlnet=controlnet, scheduler=base.scheduler, safety_checker=None, feature_extractor=None,
            requires_safety_checker=False)
        pipe.set_progress_bar_config(disable=True)
        pipe.to(BF16)
    image = torch.zeros(1, 3, 16, 16)
    assert torchdoctor.scan(pipe).ok
    pipe("a cat", image=image, num_inference_steps=1, height=16, width=16, output_type="np")
    pipe.controlnet.to(torch.float32)
    with pytest.raises(RuntimeError):
        pipe("a cat", image=image, num_inference_steps=1, height=16, width=16, output_type="np")
    report = torchdoctor.scan(pipe)
    assert [(p.path, p.role) for p in report.problems] == [("controlnet", "component")]
    msg = report.problems[0].message
    assert "pipe.controlnet.to(torch.bfloat16)" in msg and "ControlNetModel.from_pretrained(" in msg
    pipe.controlnet.to(BF16)  # the printed fix, applied: quiet, and the pipeline runs
    assert torchdoctor.scan(pipe).ok
    pipe("a cat", image=image, num_inference_steps=1, height=16, width=16, output_type="np")


def test_a_pipeline_that_casts_at_the_boundary_is_quiet() -> None:
    """A pipeline whose own code brings latents to the VAE's dtype and casts text-encoder outputs to the
    denoiser's (as SDXL's does): an fp32 VAE and text encoder beside a bf16 UNet are by design."""
    from diffusers import StableDiffusionPipeline

    class CastingPipeline(StableDiffusionPipeline):
        def decode(self, latents: torch.Tensor) -> torch.Tensor:
            return self.vae.decode(latents.to(self.vae.dtype)).sample

        def embed(self, ids: torch.Tensor) -> torch.Tensor:
            return self.text_encoder(ids)[0].to(dtype=self.unet.dtype)

    base = zoo.tiny_sd_pipeline()
    pipe = CastingPipeline(**base.components, requires_safety_checker=False)
    pipe.unet.to(BF16)
    assert torchdoctor.scan(pipe).ok
    latents = torch.zeros(1, 4, 4, 4, dtype=BF16)
    emb = pipe.embed(torch.tensor([[0, 5, 1]]))
    assert pipe.unet(latents, 1, encoder_hidden_states=emb).sample.dtype == BF16
    assert pipe.decode(latents).dtype == torch.float32
    pipe.vae.to(torch.float16)  # not what the code casts for: a real leftover is still judged per tensor
    assert not torchdoctor.scan(pipe, dtype=BF16).ok
