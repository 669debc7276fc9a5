"""scan / move / guard on real-world set-ups the other test files do not cover: one wrong tensor inside an fp32
peft adapter over a bf16 base, RNN flat weights, parametrizations, old-style weight_norm, BatchNorm counters,
tied embeddings with non-persistent buffers, tensors in dataclasses and nested dicts, and bad arguments."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from support import zoo
from support.helpers import assert_unchanged
from torch import nn
from torch.nn.utils import parametrizations, parametrize

import torchdoctor
from torchdoctor import PlacementError

bf = torch.bfloat16
LAYER = "base_model.model.model.layers.1.self_attn.v_proj"


def _lora_with_bf16_lora_b() -> nn.Module:
    """peft's default fp32 adapters over a bf16 base, with one lora_B cast to bf16 (lora_A stays fp32)."""
    model = zoo.lora_llama(bf)
    lora_b = model.get_submodule(f"{LAYER}.lora_B.default")
    lora_b.weight.data = lora_b.weight.data.to(bf)
    return model


def test_scan_names_the_odd_tensor_within_a_peft_adapter() -> None:
    model = _lora_with_bf16_lora_b()
    assert [(p.kind, p.path, p.expected) for p in torchdoctor.scan(model).problems] == [
        ("dtype", f"{LAYER}.lora_B.default.weight", "float32")]


def test_guard_explain_blames_the_adapter_weight_not_the_fp32_activation() -> None:
    # The bf16 model majority is right for the base, but inside an fp32 adapter the fp32 activation coming out
    # of lora_A is correct: the culprit is lora_B's weight, and the fix casts it to fp32 (what scan says).
    model = _lora_with_bf16_lora_b()
    with pytest.raises(PlacementError) as info, torchdoctor.guard(model):
        model(input_ids=torch.tensor([[3, 4, 5, 6]]))
    err = info.value
    assert [p.path for p in err.problems] == [f"{LAYER}.lora_B.default.weight"]
    assert err.fix is not None and err.fix.endswith("lora_B.default.weight.data.to(torch.float32)")
    assert "pass input" not in err.fix


@pytest.mark.parametrize("mode", ["fix", "warn"])
def test_guard_fix_aligns_to_the_adapter_dtype(mode: str) -> None:
    model = _lora_with_bf16_lora_b()
    with warnings.catch_warnings(record=True), torchdoctor.guard(model, mode=mode) as g, torch.no_grad():
        warnings.simplefilter("always")
        model(input_ids=torch.tensor([[3, 4, 5, 6]]))
    assert [(f.path, f.found, f.expected) for f in g.fixes] == [(f"{LAYER}.lora_B.default.weight", "bfloat16", "float32")]


@pytest.mark.parametrize("device", [0, 1])
def test_an_integer_device_says_what_it_means(device: int) -> None:
    # torch reads an int as an accelerator ordinal; on a machine without one the message must say so,
    # not "not a device: 0"
    with pytest.raises(ValueError, match=rf"index {device}.*accelerator.*'cuda:{device}'"):
        torchdoctor.scan(nn.Linear(2, 2), device=device)


def test_guard_strict_blames_an_fp32_input_not_the_bf16_model() -> None:
    # the commonest mistake: fp32 features into a bf16 Whisper. strict must not advise casting the model to fp32
    built = zoo.build("whisper", bf)
    inputs = {**built.kwargs, "input_features": built.kwargs["input_features"].float()}
    with pytest.raises(PlacementError) as info, torchdoctor.guard(built.obj, mode="strict"):
        built.obj(**inputs)
    err = info.value
    assert err.module_path == "model.encoder.conv1"
    # the culprit is named as the caller passed it (issue 25: an argument of the top-level call, by name)
    assert [(p.path, p.found, p.expected) for p in err.problems] == [("input_features", "float32", "bfloat16")]
    assert "expected bfloat16 like the model" in str(err)
    assert "culprit input_features (an argument of the WhisperForConditionalGeneration call)" in str(err)
    assert err.fix == "# pass input_features as tensor.to(torch.bfloat16)"


def _normed_mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(32, 32), parametrizations.weight_norm(nn.Linear(32, 32)),
                         parametrizations.spectral_norm(nn.Linear(32, 32)), nn.Linear(32, 32))


@pytest.mark.parametrize("dtype", [torch.float32, bf, torch.float16])
def test_parametrized_model_is_quiet_and_moves_whole(dtype: torch.dtype) -> None:
    model = _normed_mlp()
    torchdoctor.move(model, "cpu", dtype)
    assert parametrize.is_parametrized(model[1], "weight") and parametrize.is_parametrized(model[2], "weight")
    assert {t.dtype for t in [*model.parameters(), *model.buffers()]} == {dtype}
    for kw in ({}, {"device": "cpu", "dtype": dtype}):
        assert torchdoctor.scan(model, **kw).problems == ()
    if dtype != torch.float16:  # no fp16 addmv on CPU
        with torchdoctor.guard(model, mode="strict"), torch.no_grad():
            assert model(torch.randn(2, 32, dtype=dtype)).dtype == dtype


def test_spectral_norm_vector_left_fp32_is_not_a_norm_weight() -> None:
    # _SpectralNorm's power-iteration vectors are not a LayerNorm's fp32 weight: a bf16 model's fp32 `_u` is wrong
    model = _normed_mlp().to(bf)
    sn = model[2].parametrizations.weight[0]
    sn._u = sn._u.float()
    assert [(p.kind, p.path) for p in torchdoctor.scan(model).problems] == [("dtype", "2.parametrizations.weight.0._u")]


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_guard_names_a_parametrization_original_by_its_path(mode: str) -> None:
    # parametrize passes original0/original1 to _WeightNorm.forward as inputs: they are still the model's tensors
    model = _normed_mlp().to(bf)
    original = model[1].parametrizations.weight.original1
    original.data = original.data.float()
    with pytest.raises(PlacementError) as info, torchdoctor.guard(model, mode=mode):
        model(torch.randn(2, 32, dtype=bf))
    err = info.value
    assert [(p.path, p.found, p.expected) for p in err.problems] == [
        ("1.parametrizations.weight.original1", "float32", "bfloat16")]
    assert err.fix == ("model[1].parametrizations.weight.original1.data = "
                       "model[1].parametrizations.weight.original1.data.to(torch.bfloat16)")


class _Heads(nn.Module):
    """Heads in an nn.ModuleDict keyed by str(i), next to an nn.ModuleList: the fix must index each the right way."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(32, 32)])
        self.heads = nn.ModuleDict({"0": nn.Linear(32, 32), "1": nn.Linear(32, 32)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.heads["1"](self.heads["0"](self.blocks[0](x)))


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_fix_code_indexes_a_module_dict_with_digit_keys_by_string(mode: str) -> None:
    model = _Heads().to(bf)
    model.heads["1"].weight.data = model.heads["1"].weight.data.float()
    with pytest.raises(PlacementError) as info, torchdoctor.guard(model, mode=mode):
        model(torch.randn(2, 32, dtype=bf))
    fix = info.value.fix
    assert fix == "model.heads['1'].weight.data = model.heads['1'].weight.data.to(torch.bfloat16)"
    exec(fix, {"model": model, "torch": torch})  # the fix is Python that runs
    assert torchdoctor.scan(model).problems == ()


class _Pipe:
    """A pipeline with a big bf16 UNet and an fp32 VAE (the usual upcast VAE) that forgets latents.to(vae.dtype)."""

    def __init__(self) -> None:
        self.unet = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)).to(bf)
        self.vae = nn.Sequential(nn.Linear(64, 8))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.vae(self.unet(x))


@pytest.mark.parametrize("mode", ["explain", "strict", "fix"])
def test_a_float32_component_fed_by_a_bf16_pipeline_is_the_component_to_cast(mode: str) -> None:
    """The pipeline does not cast at the unet -> vae boundary, so the fp32 VAE cannot take the bf16 latents: scan
    names the component (issue: one of the most reported dtype bugs, a ControlNet or VAE left in float32 in a bf16
    pipeline), and guard's fix casts or loads that component, with casting its inputs only as the alternative.
    fix mode runs the call as the fix would (the component's operands in its neighbours' dtype) and never changes
    the model."""
    pipe = _Pipe()
    [p] = torchdoctor.scan(pipe).problems
    assert (p.kind, p.path, p.role, p.found, p.expected) == ("dtype", "vae", "component", "float32", "bfloat16")
    assert "pipe.vae.to(torch.bfloat16)" in p.message
    x = torch.randn(2, 64, dtype=bf)
    if mode == "fix":
        with torchdoctor.guard(pipe, mode="fix") as g:
            assert pipe(x).dtype == torch.bfloat16
        assert [(f.path, f.found, f.expected) for f in g.fixes] == [("vae", "float32", "bfloat16")]
        assert pipe.vae[0].weight.dtype == torch.float32
        return
    with pytest.raises(PlacementError) as info, torchdoctor.guard(pipe, mode=mode):
        pipe(x)
    err = info.value
    assert err.module_path == "vae.0"
    # the component is the culprit, first; the bf16 latents it was fed follow as what it received
    assert [(p.path, p.role, p.found, p.expected) for p in err.problems][0] == ("vae", "component", "float32",
                                                                             "bfloat16")
    assert ("bfloat16", "float32") in [(p.found, p.expected) for p in err.problems[1:]]
    assert err.fix is not None and err.fix.startswith("pipe.vae.to(torch.bfloat16)")


def _fp8_llama() -> nn.Module:
    """A bf16 Llama whose q/o projections are transformers' fine-grained FP8Linear: float8 weights with fp32 block
    scales (``weight_scale_inv``), as ``from_pretrained`` loads an FP8 checkpoint."""
    from transformers.integrations.finegrained_fp8 import FP8Linear

    model = zoo.tiny_llama(bf)
    for layer in model.model.layers:
        for name in ("q_proj", "o_proj"):
            dense = getattr(layer.self_attn, name)
            fp8 = FP8Linear(dense.in_features, dense.out_features, block_size=(32, 32))
            fp8.weight.data = dense.weight.data.float().to(torch.float8_e4m3fn)
            fp8.weight_scale_inv.data = torch.rand_like(fp8.weight_scale_inv)
            setattr(layer.self_attn, name, fp8)
    return model


def test_fp8_block_scales_are_quantization_metadata() -> None:
    model = _fp8_llama()
    assert torchdoctor.scan(model).problems == ()
    assert torchdoctor.scan(model, device="cpu").problems == ()
    torchdoctor.move(model, "cpu", torch.float16)  # the model's dtype changes; the FP8 weights and scales do not
    q = model.model.layers[0].self_attn.q_proj
    assert (q.weight.dtype, q.weight_scale_inv.dtype) == (torch.float8_e4m3fn, torch.float32)
    assert model.model.layers[0].self_attn.k_proj.weight.dtype == torch.float16
    assert torchdoctor.scan(model).problems == ()


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_rnn_flat_weights_follow_move(cls: type[nn.RNNBase]) -> None:
    rnn = cls(4, 8, num_layers=2)
    torchdoctor.move(rnn, "cpu", bf)
    assert all(f is getattr(rnn, n) for f, n in zip(rnn._flat_weights, rnn._flat_weights_names))
    assert rnn(torch.randn(3, 2, 4, dtype=bf))[0].dtype == bf
    assert torchdoctor.scan(rnn, device="cpu", dtype=bf).problems == ()
    torchdoctor.move(rnn, "meta")
    assert {f.device.type for f in rnn._flat_weights} == {"meta"}


@dataclasses.dataclass
class _Rope:
    cos: torch.Tensor
    cache: dict[str, dict[str, torch.Tensor]]


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4, padding_idx=0)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.norm = nn.BatchNorm1d(4)
        self.register_buffer("positions", torch.arange(5), persistent=False)
        self.register_buffer("freqs_cis", torch.polar(torch.ones(4), torch.randn(4)), persistent=False)
        self.rope = _Rope(torch.ones(4), {"k": {"v": torch.zeros(4)}})


def test_move_keeps_ties_integers_and_complex_and_reaches_dataclasses() -> None:
    model = _Tied()
    assert torchdoctor.scan(model).problems == ()
    torchdoctor.move(model, "cpu", bf)
    assert model.head.weight is model.embed.weight and model.embed.weight.dtype == bf
    assert (model.positions.dtype, model.norm.num_batches_tracked.dtype) == (torch.int64, torch.int64)
    assert model.freqs_cis.dtype == torch.complex64  # Module.to(bf16) would drop the imaginary part
    assert (model.rope.cos.dtype, model.rope.cache["k"]["v"].dtype) == (bf, bf)
    for kw in ({}, {"device": "cpu", "dtype": "bf16"}):
        assert assert_unchanged(model, torchdoctor.scan, model, **kw).problems == ()


@pytest.mark.filterwarnings("ignore:Casting complex values")
def test_scan_with_a_dtype_names_tensors_module_to_left_in_dataclasses_and_dicts() -> None:
    model = _Tied().to(bf)
    # a module's plain attributes are judged against the module, with or without dtype= (Module.to left them)
    assert sorted(p.path for p in torchdoctor.scan(model).problems) == ["rope.cache.k.v", "rope.cos"]
    assert sorted(p.path for p in torchdoctor.scan(model, dtype="bf16").problems) == ["rope.cache.k.v", "rope.cos"]


@pytest.mark.parametrize("dtype", ["int8", torch.bool, "int64"])
def test_scan_refuses_a_non_floating_dtype_like_move(dtype: object) -> None:
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="must be a floating dtype"):
        torchdoctor.scan(model, dtype=dtype)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="floating dtype"):
        torchdoctor.move(model, dtype=dtype)  # type: ignore[arg-type]


def test_cli_refuses_a_non_floating_dtype_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from torchdoctor._cli.main import main

    for verb in ("scan", "simulate"):
        extra = ["--device", "cuda:1"] if verb == "simulate" else []
        assert main([verb, "torch.nn:Identity", "--dtype", "int8", *extra]) == 2
        err = capsys.readouterr().err
        assert "a floating dtype is expected" in err and "Traceback" not in err


@pytest.mark.parametrize("mode", ["strict", "fix"])
def test_a_simulation_inside_a_strict_guard_is_judged_by_the_simulation_only(mode: str) -> None:
    """``pytest --torchdoctor=strict`` around a test that calls ``simulate``: the planted conv input dtype is the
    simulation's finding (reported, run continued), not an error of the outer guard; a clean run stays clean."""
    conv = nn.Sequential(nn.Conv2d(4, 4, 2)).to(torch.bfloat16)
    with torchdoctor.guard(mode=mode):
        clean = torchdoctor.simulate(conv, (torch.randn(1, 4, 8, 8, dtype=torch.bfloat16),), device="cuda:1",
                                     dtype=torch.bfloat16)
        planted = torchdoctor.simulate(conv, device="cuda:1",
                                       call=lambda m: (m.to("cuda:1"), m(torch.randn(1, 4, 8, 8, device="cuda:1"))))
    assert clean.ok, clean.problems
    assert [(p.kind, p.found, p.expected) for p in planted.problems] == [("dtype", "float32", "bfloat16")]
