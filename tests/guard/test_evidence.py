"""Blame by evidence (guard, explain and strict): the culprit is a tensor that reached the failing op — the failing
module's own tensor its code reads, a tensor of a module that ran before it, an argument of the call — and only it
gets the fix. Other off-policy tensors follow as "also off-policy, not involved in this failure", never first.
Each case both ways: the culprit named first when it reached the op, quiet (or not blamed) when it did not."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdoctor
from support import zoo

BF = torch.bfloat16
NOT_INVOLVED = "also off-policy, not involved in this failure"


def _fail(model: Any, call: Any, mode: str = "explain") -> torchdoctor.PlacementError:
    with pytest.raises(torchdoctor.PlacementError) as info:
        with torch.no_grad(), torchdoctor.guard(model, mode=mode):
            call()
    return info.value


def _llama() -> Any:
    b = zoo.build("llama", BF)
    return b.obj, b.inputs


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_an_unused_fp32_attribute_is_not_the_culprit(mode: str) -> None:
    model, inputs = _llama()
    model.model.unused_scale = torch.ones(64)  # never read by any forward
    down = model.model.layers[0].mlp.down_proj
    down.weight.data = down.weight.data.float()
    err = _fail(model, lambda: model(**inputs), mode)
    text = str(err)
    assert err.problems[0].path == "model.layers.0.mlp.down_proj.weight"
    assert "culprit model.layers.0.mlp.down_proj.weight" in text
    assert "caused by `model.unused_scale`" not in text and "unused_scale.data" not in (err.fix or "")
    assert f"{NOT_INVOLVED}: model.unused_scale" in text
    assert text.index("culprit model.layers.0.mlp.down_proj.weight") < text.index(NOT_INVOLVED)


class _Scaled(nn.Module):
    """The same attribute, read by the forward: then it is the culprit."""

    def __init__(self, read: bool) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Linear(16, 16) for _ in range(3)])
        self.head = nn.Linear(16, 16)
        self.scale = torch.ones(16)
        self.read = read

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(x)
        if self.read:
            x = x * self.scale
        return self.head(x)


class _Unread(_Scaled):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_an_attribute_the_forward_reads_is_the_culprit(mode: str) -> None:
    model = _Scaled(read=True).to(BF)
    model.scale = torch.ones(16)  # Module.to never casts a plain attribute
    err = _fail(model, lambda: model(torch.randn(2, 16, dtype=BF)), mode)
    assert err.problems[0].path == "scale"
    if mode == "explain":  # the error torch raised, at the head's addmm
        assert str(err).startswith("dtype mismatch caused by `scale` (float32, expected bfloat16)")
    else:  # strict stops where the float32 attribute promoted the bf16 data, before the addmm that refused it
        assert str(err).startswith("dtype problem in `<root>` (_Scaled) at aten.mul.Tensor: arg 1 (other) is "
                                   "float32 and promotes the model's bfloat16 to float32 silently")
    assert "model.scale.data = model.scale.data.to(torch.bfloat16)" in (err.fix or "")


def test_the_same_attribute_unread_is_quiet() -> None:
    model = _Unread(read=False).to(BF)
    model.scale = torch.ones(16)
    with torch.no_grad(), torchdoctor.guard(model, mode="strict"):
        out = model(torch.randn(2, 16, dtype=BF))
    assert out.dtype == BF


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_a_module_that_has_not_run_is_not_the_culprit(mode: str) -> None:
    model, inputs = _llama()
    model.lm_head.weight.data = torch.randn_like(model.lm_head.weight, dtype=torch.float32)  # runs last
    model.lm_head.weight = nn.Parameter(model.lm_head.weight.data)  # untie from the embedding
    down = model.model.layers[0].mlp.down_proj
    down.weight.data = down.weight.data.float()
    err = _fail(model, lambda: model(**inputs), mode)
    assert err.problems[0].path == "model.layers.0.mlp.down_proj.weight"
    assert f"{NOT_INVOLVED}: lm_head.weight" in str(err)
    assert "lm_head" not in (err.fix or "")


def test_controlnet_assign_load_blames_the_layer_that_ran_not_the_mid_block() -> None:
    """A ControlNet-style ``load_state_dict(..., assign=True)`` of float32 tensors into a bf16 model: the
    assigned parameters take the file's dtype. Only the one that reached the failing op is the culprit."""
    from diffusers import ControlNetModel

    unet = zoo.tiny_unet(BF)
    cn = ControlNetModel.from_unet(unet).to(BF)
    late = {k: v.float() for k, v in cn.state_dict().items() if k.startswith("controlnet_mid_block")}
    early = {k: v.float() for k, v in cn.state_dict().items() if k.startswith("time_embedding.linear_1")}
    cn.load_state_dict({**late, **early}, strict=False, assign=True)
    inputs = dict(zoo.build("unet", BF).inputs)
    cond = torch.zeros(1, 3, 64, 64, dtype=BF)
    err = _fail(cn, lambda: cn(**inputs, controlnet_cond=cond, return_dict=False))
    assert err.module_path == "time_embedding.linear_1"
    assert err.problems[0].path.startswith("time_embedding.linear_1.")
    assert "culprit time_embedding.linear_1." in str(err)
    assert "controlnet_mid_block" not in (err.fix or "")


class _ModelSampling(nn.Module):
    """ComfyUI's model_sampling: the schedule in float32, read by methods outside the diffusion model's forward."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("sigmas", torch.linspace(0.03, 14.6, 1000))

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        return (sigma - self.sigmas[:, None]).abs().argmin(dim=0).float()


class _BaseModel(nn.Module):
    def __init__(self, unet: nn.Module) -> None:
        super().__init__()
        self.diffusion_model = unet
        self.model_sampling = _ModelSampling()

    def apply_model(self, x: torch.Tensor, sigma: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        t = self.model_sampling.timestep(sigma)
        return self.diffusion_model(x, t, encoder_hidden_states=context).sample


def _comfy(broken: bool) -> tuple[_BaseModel, dict[str, Any]]:
    unet = zoo.tiny_unet(BF)
    if broken:
        unet.conv_in.weight.data = unet.conv_in.weight.data.float()
    inputs = dict(zoo.build("unet", BF).inputs)
    return _BaseModel(unet), {"x": inputs["sample"], "sigma": torch.tensor([1.0]),
                              "context": inputs["encoder_hidden_states"]}


def test_comfyui_fp32_sigmas_outside_the_forward_are_never_blamed_nor_cast() -> None:
    model, kw = _comfy(broken=True)
    err = _fail(model, lambda: model.apply_model(**kw))
    assert err.problems[0].path == "diffusion_model.conv_in.weight"
    assert "sigmas" not in (err.fix or "") and "caused by `model_sampling" not in str(err)


def test_comfyui_fp32_sigmas_with_a_correct_model_are_quiet() -> None:
    model, kw = _comfy(broken=False)
    with torch.no_grad(), torchdoctor.guard(model, mode="strict"):
        out = model.apply_model(**kw)
    assert out.dtype == BF


def test_a_float32_argument_of_the_call_is_named_by_its_argument() -> None:
    model, inputs = _llama()
    embeds = model.get_input_embeddings()(inputs["input_ids"]).float()
    err = _fail(model, lambda: model(inputs_embeds=embeds))
    text = str(err)
    assert "culprit inputs_embeds (an argument of the LlamaForCausalLM call)" in text, text
    assert "# pass inputs_embeds as tensor.to(torch.bfloat16)" in (err.fix or "")


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        return torch.matmul(self.proj(x), rope)


class _Vision(nn.Module):
    """Qwen-VL style: a list of rotary tables passed as a keyword argument."""

    def __init__(self) -> None:
        super().__init__()
        self.block = _Block()

    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.block(x, kwargs["rotary_pos_emb_list"][0])


def test_a_tensor_in_a_keyword_list_is_named_by_argument_and_index() -> None:
    model = _Vision().to(BF)
    err = _fail(model, lambda: model(torch.randn(2, 8, dtype=BF), rotary_pos_emb_list=[torch.eye(8)]))
    assert err.problems[0].path == "kwargs['rotary_pos_emb_list'][0]"
    assert "culprit kwargs['rotary_pos_emb_list'][0] (an argument of the _Vision call)" in str(err)
    with torch.no_grad(), torchdoctor.guard(model, mode="strict"):
        model(torch.randn(2, 8, dtype=BF), rotary_pos_emb_list=[torch.eye(8, dtype=BF)])


def test_explain_mode_explains_an_error_outside_any_module() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 3)).to(BF)
    mask = torch.ones(4, 3, dtype=torch.bool)
    with pytest.raises(torchdoctor.PlacementError) as info, torchdoctor.guard(model):
        out = model(torch.randn(4, 8, dtype=BF))
        loss = F.binary_cross_entropy(out.sigmoid(), mask.float())
    e = info.value
    assert str(e).startswith("dtype mismatch outside the guarded model, at test_evidence.py:")
    assert "culprit mask.float() makes float32" in str(e)
    assert e.fix == "# mask.float() -> mask.to(torch.bfloat16)"
    assert isinstance(e.__cause__, RuntimeError)
    with torchdoctor.guard(model):  # the correct variant: cast to the output's dtype
        out = model(torch.randn(4, 8, dtype=BF))
        loss = F.binary_cross_entropy(out.sigmoid(), mask.to(out.dtype))
    assert loss.dtype == BF


def _controlnet_pipe(cn_dtype: torch.dtype) -> tuple[Any, dict[str, Any]]:
    from diffusers import ControlNetModel

    unet = zoo.tiny_unet(BF)
    cn = ControlNetModel.from_unet(unet).to(cn_dtype)

    class Pipe:  # holds several models, as a DiffusionPipeline does; the ControlNet feeds the UNet
        def __init__(self) -> None:
            self.unet, self.controlnet = unet, cn

        def __call__(self, sample: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor) -> Any:
            cond = torch.zeros(1, 3, 64, 64, dtype=BF)
            down, mid = self.controlnet(sample, timestep, encoder_hidden_states, controlnet_cond=cond,
                                        return_dict=False)
            return self.unet(sample, timestep, encoder_hidden_states, down_block_additional_residuals=down,
                             mid_block_additional_residual=mid)

    return Pipe(), dict(zoo.build("unet", BF).inputs)


def test_fp32_controlnet_in_a_bf16_pipeline_is_fixed_by_casting_the_controlnet() -> None:
    pipe, inputs = _controlnet_pipe(torch.float32)
    err = _fail(pipe, lambda: pipe(**inputs))
    assert "`controlnet` runs in float32 while the data flowing in is bfloat16" in str(err).splitlines()[0]
    assert (err.fix or "").startswith("pipe.controlnet.to(torch.bfloat16)")  # a pipeline is `pipe`
    assert "pass input 0 as tensor.to(torch.float32)" not in (err.fix or "")
    pipe, inputs = _controlnet_pipe(BF)
    with torch.no_grad(), torchdoctor.guard(pipe, mode="strict"):
        pipe(**inputs)


@pytest.mark.parametrize("f8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("grad", [True, False])
def test_fix_mode_aligns_float8_weights_of_a_plain_linear(f8: torch.dtype, grad: bool) -> None:
    block = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64)).to(BF)
    for layer in (block[0], block[2]):
        layer.weight.data = layer.weight.data.to(f8)
    x = torch.randn(3, 2, 64, dtype=BF)
    with pytest.raises(RuntimeError):
        block(x)
    before = block[0].weight.dtype
    with torch.set_grad_enabled(grad), torchdoctor.guard(block, mode="fix") as g:
        out = block(x)
    assert out.dtype == BF and block[0].weight.dtype == before == f8  # cast for the op, the model unchanged
    assert {(f.path, f.found, f.expected) for f in g.fixes} >= {("0.weight", str(f8).split(".")[1], "bfloat16")}


class _ScaledAttr(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.blocks = nn.Sequential(*[nn.Linear(16, 16) for _ in range(3)])
        self.scale = torch.ones(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.blocks(x) * self.scale)


def test_a_model_compiled_inside_the_guard_names_the_model_path() -> None:
    model = _ScaledAttr().to(BF)
    model.scale = torch.ones(16)  # float32: the graph holds it as a constant
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager")
    err = _fail(compiled, lambda: compiled(torch.randn(2, 16, dtype=BF)))
    text = str(err)
    assert "_tensor_constant" not in text and "outside the guarded model" not in text, text
    assert err.problems[0].path == "scale" and "model.scale.data = model.scale.data.to(torch.bfloat16)" in (
        err.fix or "")
