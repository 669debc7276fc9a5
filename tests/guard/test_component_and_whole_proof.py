"""Three wrong answers a black-box hunt found, pinned on real libraries: a component odd as a whole (an fp32 VAE in
an fp16 pipeline, fp32 adapters added to every block of a bf16 Llama) is what the fix casts, not the tensors of the
one op that failed first; a fix is proven by re-running the whole forward on a copy, so a fix that breaks a later op
is never "proven"; and the model's dtype is what holds its parameters (elements), not a count of tensors."""

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor
from support.zoo import tiny_llama, tiny_unet, tiny_vae
from torchdoctor._guard.component import odd_groups, prove_whole

BF, HALF = torch.bfloat16, torch.float16


def _fail(model: nn.Module, call: Any, mode: str) -> torchdoctor.PlacementError:
    with pytest.raises(torchdoctor.PlacementError) as ei:
        with torchdoctor.guard(model, mode=mode):
            call()
    return ei.value


def _apply(fix: str, model: nn.Module) -> None:
    exec(fix, {"torch": torch, "model": model})  # the printed fix, pasted


class Pipe(nn.Module):
    """An fp16 UNet feeding an AutoencoderKL left in float32 (CogVideoXWrapper#228)."""

    def __init__(self) -> None:
        super().__init__()
        self.unet = tiny_unet(HALF)
        self.vae = tiny_vae()

    def forward(self, latents: torch.Tensor, t: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        return self.vae.decode(self.unet(latents, t, ctx).sample).sample


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_an_fp32_vae_in_an_fp16_pipeline_is_cast_whole_and_proven_by_a_rerun(mode: str) -> None:
    p = Pipe()
    x = (torch.randn(1, 4, 8, 8, dtype=HALF), torch.tensor([10]), torch.randn(1, 6, 8, dtype=HALF))
    err = _fail(p, lambda: p(*x), mode)
    assert err.fix == "model.vae.to(torch.float16)"
    assert "culprit `vae`: every tensor in it is float32 while the rest of the model is float16" in str(err)
    assert err.proof == "fix proven: the whole forward runs again on a copy of the model with `vae` -> float16"
    assert p.vae.post_quant_conv.weight.dtype == torch.float32  # the proof ran on a copy
    _apply(err.fix, p)
    assert p(*x).dtype == HALF  # applied, the next layer does not fail


class Bottleneck(nn.Module):
    """An adapter added in float32 after the model was cast to bf16 (adapter-hub adapters#766)."""

    def __init__(self, inner: nn.Module, d: int) -> None:
        super().__init__()
        self.inner, self.down, self.up = inner, nn.Linear(d, 4), nn.Linear(4, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inner(x)
        return h + self.up(torch.relu(self.down(h)))


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_fp32_adapters_in_every_block_are_all_cast(mode: str) -> None:
    m = tiny_llama(BF)
    for layer in m.model.layers:
        layer.mlp = Bottleneck(layer.mlp, m.config.hidden_size)
    ids = torch.tensor([[1, 2, 3, 4]])
    err = _fail(m, lambda: m(ids), mode)
    n = len(m.model.layers)
    want = [f"model.model.layers[{i}].mlp.{x}.to(torch.bfloat16)" for i in range(n) for x in ("down", "up")]
    assert (err.fix or "").splitlines() == want
    assert (err.proof or "").startswith("fix proven: the whole forward runs again on a copy of the model with")
    _apply(err.fix or "", m)
    assert m(ids).logits.dtype == BF


class _LoRAMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w, a, b)
        return x @ w.t() + (x @ a.t().to(x.dtype)) @ b.t().to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> Any:
        x, w, a, b = ctx.saved_tensors
        h = x @ a.t().to(x.dtype)
        return dy @ w, None, (dy @ b).t() @ x, dy.t() @ h  # dy bf16 @ b fp32: the kernel's bug (unsloth#320)


class LoraLinear(nn.Module):
    def __init__(self, d: int = 64, r: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.weight = nn.Parameter(torch.randn(d, d).to(BF), requires_grad=False)  # the frozen base
        self.lora_A = nn.Parameter(torch.randn(r, d))
        self.lora_B = nn.Parameter(torch.randn(d, r))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _LoRAMatmul.apply(x, self.weight, self.lora_A, self.lora_B)


def test_two_small_fp32_lora_tensors_do_not_outvote_one_large_bf16_base() -> None:
    m, x = LoraLinear(), torch.randn(3, 64, dtype=BF, requires_grad=True)
    err = _fail(m, lambda: m(x).sum().backward(), "strict")
    assert "the model is float32" not in str(err) and "model.weight" not in (err.fix or "")
    assert "culprit lora_A" in str(err) or "culprit lora_B" in str(err)
    assert "model.lora_B.data = model.lora_B.data.to(torch.bfloat16)" in (err.fix or "")
    assert (err.proof or "").startswith("fix proven")
    _apply(err.fix or "", m)
    m(x).sum().backward()  # applied, forward and backward run


def test_a_fix_that_breaks_a_later_op_is_not_proven_by_the_whole_rerun() -> None:
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    m, x = Two(), torch.randn(2, 4)
    frames = SimpleNamespace(stack=[m], inputs=[(x,)], ran=[m], bw=[], inputs_of=lambda mod: (x,) if mod is m else ())
    session = SimpleNamespace(frames=frames, replaying=False)
    said = prove_whole(session, m, lambda c: c.a.to(BF), "a -> bfloat16")
    assert said is not None and said.startswith("fix unproven: the whole forward re-run with a -> bfloat16: "
                                                "RuntimeError:"), said
    assert frames.stack == [m] and frames.ran == [m] and not session.replaying and m.a.weight.dtype == torch.float32
    ok = prove_whole(session, m, lambda c: None, "nothing")
    assert ok == "fix proven: the whole forward runs again on a copy of the model with nothing"


def test_odd_groups_stop_where_a_module_mixes_dtypes() -> None:
    m = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 2), nn.Linear(2, 2)), nn.Linear(8, 8))
    m[0].to(BF), m[2].to(BF)
    entries = [SimpleNamespace(path=n, tensor=t) for n, t in m.named_parameters()]
    assert odd_groups(entries, {"1.0.weight"}, torch.float32) == ["1"]
    m[1][1].to(BF)  # now `1` mixes dtypes: the culprit's own Linear is the group, and it holds only its tensors
    entries = [SimpleNamespace(path=n, tensor=t) for n, t in m.named_parameters()]
    assert odd_groups(entries, {"1.0.weight"}, torch.float32) == ["1.0"]
    assert odd_groups(entries, {"1.0.weight", "1.0.bias"}, torch.float32) is None
