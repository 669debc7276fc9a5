"""Public reports rebuilt in a few lines each: the culprit named first is the tensor that reached the failing op (by
model path, by the caller's argument, or by the factory that made it), and the fix targets it. Each case also runs
the corrected variant, which must be quiet."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor
from support import zoo

BF, HALF = torch.bfloat16, torch.float16


def _fail(model: Any, call: Any, mode: str = "explain") -> torchdoctor.PlacementError:
    with pytest.raises(torchdoctor.PlacementError) as info:
        with torch.no_grad(), torchdoctor.guard(model, mode=mode):
            call()
    return info.value


def _quiet(model: Any, call: Any) -> None:
    with torch.no_grad(), torchdoctor.guard(model, mode="strict"):
        call()


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_lora_adapter_left_float32_in_a_bf16_llama(mode: str) -> None:
    """https://github.com/hiyouga/LlamaFactory/issues/4432 — LLaMA + LoRA inference: "expected mat1 and mat2 to have
    the same dtype, but got: c10::Half != float": one adapter's weights stayed float32 in a half-precision model."""
    model = zoo.lora_llama(BF, autocast_adapter_dtype=False)
    ids = torch.tensor([[3, 4, 5, 6]])
    _quiet(model, lambda: model(input_ids=ids))
    q = model.base_model.model.model.layers[0].self_attn.q_proj
    q.lora_A["default"].weight.data = q.lora_A["default"].weight.data.float()
    err = _fail(model, lambda: model(input_ids=ids), mode)
    assert err.problems[0].path == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", str(err)
    assert "lora_A.default.weight.data.to(torch.bfloat16)" in (err.fix or "")


class _Adapter(nn.Module):
    def __init__(self, base: nn.Linear) -> None:
        super().__init__()
        self.base = base
        self.down = nn.Linear(base.in_features, 4, bias=False)  # built after the model's .to(bf16): float32
        self.up = nn.Linear(4, base.out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.up(self.down(x))


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_adapter_added_after_the_cast_stays_float32(mode: str) -> None:
    """https://github.com/adapter-hub/adapters/issues/766 — adapter-initialized tensors conflict with the model's
    dtype: modules added after ``model.to(bf16)`` are float32."""
    b = zoo.build("llama", BF)
    mlp = b.obj.model.layers[0].mlp
    mlp.down_proj = _Adapter(mlp.down_proj)
    err = _fail(b.obj, lambda: b.obj(**b.inputs), mode)
    assert err.problems[0].path == "model.layers.0.mlp.down_proj.down.weight", str(err)
    assert "also off-policy" not in str(err).splitlines()[0]
    mlp.down_proj.to(BF)
    _quiet(b.obj, lambda: b.obj(**b.inputs))


class _TokenEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokenConv = nn.Conv1d(4, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tokenConv(x.permute(0, 2, 1)).transpose(1, 2)


def test_bf16_data_into_a_float32_model_casts_the_model() -> None:
    """https://github.com/KimMeen/Time-LLM/issues/101 — "expected scalar type BFloat16 but found Float": the caller
    passed ``x.to(torch.bfloat16)`` into a patch embedding that was never cast; the fix casts the module."""
    model = _TokenEmbedding()
    x = torch.randn(2, 8, 4).to(BF)
    err = _fail(model, lambda: model(x))
    assert "runs in float32 while the data flowing in is bfloat16" in str(err).splitlines()[0]
    assert (err.fix or "").startswith("model.to(torch.bfloat16)")
    model.to(BF)
    _quiet(model, lambda: model(x))


class _Cellpose(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GELU(), nn.Conv2d(8, 8, 3, padding=1))
        self.out = nn.Conv2d(8, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.encoder(x))


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_output_conv_left_float32_is_the_culprit_where_it_fails(mode: str) -> None:
    """https://github.com/MouseLand/cellpose/issues/1327 — "Input type (c10::BFloat16) and bias type (float)":
    the network was cast to bf16 except its output conv (re-created after the cast)."""
    net = _Cellpose().to(BF)
    net.out = nn.Conv2d(8, 3, 1)
    x = torch.randn(1, 3, 8, 8, dtype=BF)
    err = _fail(net, lambda: net(x), mode)
    assert err.module_path == "out" and err.problems[0].path.startswith("out."), str(err)
    assert "culprit out." in str(err)
    net.out.to(BF)
    _quiet(net, lambda: net(x))


class _OldRotary(nn.Module):
    """A rotary embedding as transformers wrote it before 4.38: ``inv_freq`` is read where it is, never moved."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.arange(x.shape[1], device=x.device, dtype=self.inv_freq.dtype)
        return x[..., :4] * torch.einsum("i,j->ij", t, self.inv_freq).cos()


class _OldStyle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.rotary_emb = _OldRotary()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rotary_emb(self.proj(x))


def test_rotary_inv_freq_left_on_cpu_after_the_move() -> None:
    """https://github.com/yandex-research/specexec/issues/1 — "found at least two devices, cpu and cuda:0 ... bmm":
    an offloading loader left ``rotary_emb`` (its ``inv_freq`` buffer) on the cpu. With a rotary embedding that
    reads ``inv_freq`` where it is (the report's transformers) it is named; transformers 5's moves it to the
    input's device on every call, so there the same leftover runs on a real GPU and is quiet (issue 41 point 4)."""
    def old_step(model: nn.Module) -> None:
        model.to("cuda:0")
        model.rotary_emb.inv_freq = model.rotary_emb.inv_freq.to("cpu")
        model(torch.ones(2, 5, 8, device="cuda:0"))

    report = torchdoctor.simulate(_OldStyle(), device="cuda:0", call=old_step)
    assert report.problems and report.problems[0].path == "rotary_emb.inv_freq", report.text()
    assert "rotary_emb.inv_freq" in (report.fix or "")

    b = zoo.build("llama", torch.float32)

    def step(model: nn.Module) -> None:
        model.to("cuda:0")
        model.model.rotary_emb.inv_freq = model.model.rotary_emb.inv_freq.to("cpu")
        model(input_ids=b.inputs["input_ids"].to("cuda:0"))

    assert torchdoctor.simulate(b.obj, device="cuda:0", call=step).ok


class _Fourier(nn.Module):
    def __init__(self, sigma: float = 1.0) -> None:
        super().__init__()
        self.sigma = sigma

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        j = torch.arange(v.shape[-1])  # no device=: cpu on any GPU
        return torch.cos(v * self.sigma ** (j / v.shape[-1]))


class _FourierFixed(_Fourier):
    def forward(self, v: torch.Tensor) -> torch.Tensor:
        j = torch.arange(v.shape[-1], device=v.device)
        return torch.cos(v * self.sigma ** (j / v.shape[-1]))


def test_positional_encoder_arange_without_device_is_named_at_the_factory() -> None:
    """https://github.com/jmclong/random-fourier-features-pytorch/pull/4 — the ``torch.arange(m)`` of a positional
    encoder was created on the cpu regardless of its input."""
    report = torchdoctor.simulate(_Fourier(), (torch.randn(2, 8),), device="cuda:0")
    assert report.problems and report.problems[0].found == "cpu", report.text()
    assert "torch.arange" in report.text() and "device=" in (report.fix or "")
    assert torchdoctor.simulate(_FourierFixed(), (torch.randn(2, 8),), device="cuda:0").ok


class _LLLite(nn.Module):
    """A ControlNet-LLLite style side module in fp16 that embeds the control image."""

    def __init__(self) -> None:
        super().__init__()
        self.conditioning1 = nn.Conv2d(3, 8, 4, stride=4)
        self.mid = nn.Linear(8, 8)

    def forward(self, cond: torch.Tensor) -> torch.Tensor:
        return self.mid(self.conditioning1(cond).flatten(2).transpose(1, 2))


def test_control_image_made_float32_by_the_caller_is_named_as_its_argument() -> None:
    """https://github.com/Kosinkadink/ComfyUI-Advanced-ControlNet/issues/105 — ControlLLLite: "Input type (float)
    and bias type (c10::Half)": the node built the control image in float32 and passed it to the fp16 module."""
    module = _LLLite().to(BF)
    cond = torch.rand(1, 3, 16, 16)
    err = _fail(module, lambda: module(cond))
    assert err.problems[0].path == "cond" and "culprit cond (an argument of the _LLLite call)" in str(err), str(err)
    # the program's own line that hands it over, cast to the module's dtype there (a diff of that line)
    assert err.fix.startswith("err = _fail(module, lambda: module(cond.to(next(module.parameters()).dtype)))  # cond "
                              "handed to module in float32"), err.fix
    assert err.patch is not None and "+    err = _fail(module, lambda: module(cond.to(" in err.patch
    _quiet(module, lambda: module(cond.to(BF)))


class _Ldm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.time_embed = nn.Sequential(nn.Linear(4, 8), nn.SiLU(), nn.Linear(8, 8))
        self.input_blocks = nn.Conv2d(4, 8, 3, padding=1)

    def apply_model(self, x: torch.Tensor, t: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return self.input_blocks(x) + self.time_embed(t)[:, :, None, None] + c.mean()


def test_sampler_casting_inputs_to_bf16_for_a_float32_model_casts_the_model() -> None:
    """https://github.com/XavierXiao/Dreambooth-Stable-Diffusion/issues/91 — the sampler called
    ``apply_model(x_in.to(bfloat16), t_in.to(bfloat16), c_in.to(bfloat16))`` on a model loaded in float32."""
    model = _Ldm()
    x, t, c = torch.randn(1, 4, 8, 8).to(BF), torch.randn(1, 4).to(BF), torch.randn(1, 3).to(BF)
    err = _fail(model, lambda: model.apply_model(x, t, c))
    assert "runs in float32 while the data flowing in is bfloat16" in str(err).splitlines()[0], str(err)
    assert (err.fix or "").startswith("model.to(torch.bfloat16)")
    model.to(BF)
    _quiet(model, lambda: model.apply_model(x, t, c))


class _Vae(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.decoder = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.SiLU())
        self.post = nn.Conv2d(8, 64, 3, padding=1)  # most of the model: fp16 is its dtype

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.post(self.decoder(z))


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_two_reduced_precisions_meet_and_the_block_that_made_one_is_named(mode: str) -> None:
    """https://github.com/vladmandic/sdnext/issues/1431 — "Input type (c10::BFloat16) and bias type (c10::Half)":
    a half model where one block was loaded in bf16; it makes bf16 activations that the next fp16 layer refuses."""
    vae = _Vae().to(HALF)
    vae.decoder.to(BF)
    z = torch.randn(1, 4, 8, 8, dtype=BF)
    err = _fail(vae, lambda: vae(z), mode)
    text = str(err)
    assert err.module_path == "post" and err.problems[0].path.startswith("decoder.0."), text
    assert text.startswith("dtype mismatch caused by `decoder.0.") and "post" not in (err.fix or ""), text
    vae.decoder.to(HALF)
    _quiet(vae, lambda: vae(z.to(HALF)))


def test_a_loss_mask_made_on_the_cpu_outside_the_model_is_not_blamed_on_the_model() -> None:
    """https://github.com/mozilla/TTS/pull/549 — a sequence mask built with ``torch.arange(olen)`` on the cpu while
    the lengths are on the GPU, in the loss, outside any module."""
    model = nn.Linear(4, 4)

    def step(m: nn.Module, fixed: bool) -> None:
        m.to("cuda:0")
        lengths = torch.tensor([3, 5], device="cuda:0")
        steps = torch.arange(6, device="cuda:0" if fixed else None)
        mask = steps[None, :] < lengths[:, None]
        (m(torch.randn(2, 6, 4, device="cuda:0")).sum(-1) * mask).sum()

    report = torchdoctor.simulate(model, device="cuda:0", call=lambda m: step(m, False))
    assert [(p.kind, p.found) for p in report.problems][:1] == [("device", "cpu")], report.text()
    assert not any(p.path in ("weight", "bias") for p in report.problems)
    assert torchdoctor.simulate(nn.Linear(4, 4), device="cuda:0", call=lambda m: step(m, True)).ok
