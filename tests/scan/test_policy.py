"""The one placement policy on real setups, both directions: the correct setup is quiet, the same setup with one
planted leftover is reported by its exact path, with at most two problems."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import torchdoctor
from support import zoo
from torchdoctor._scan.policy import Policy
from torchdoctor._walk import walk


def paths(report: torchdoctor.ScanReport) -> list[str]:
    return [p.path for p in report.problems]


# --- offload by design ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def offloaded_pipe():
    pipe = zoo.tiny_sd_pipeline()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe.enable_model_cpu_offload(device="cuda:0")
    return pipe


def test_model_cpu_offload_is_quiet_and_says_offloaded(offloaded_pipe) -> None:
    report = torchdoctor.scan(offloaded_pipe)
    assert report.ok, [str(p) for p in report.problems[:5]]
    assert report.expected["unet"]["offloaded"] == "moved to cuda:0 at call by accelerate"
    assert torchdoctor.scan(offloaded_pipe, device="cuda:0").ok  # the hook's device asked for: still by design


def test_model_cpu_offload_with_a_planted_leftover(offloaded_pipe) -> None:
    bias = offloaded_pipe.unet.conv_in.bias
    saved = bias.data
    bias.data = saved.double()
    try:
        report = torchdoctor.scan(offloaded_pipe)
        assert paths(report) == ["unet.conv_in.bias"]
        assert "float64" in report.problems[0].message
    finally:
        bias.data = saved


def test_cpu_offload_with_hook_is_quiet_and_a_leftover_is_found() -> None:
    from accelerate import cpu_offload_with_hook

    unet = zoo.tiny_unet()
    cpu_offload_with_hook(unet, execution_device="cuda:0")
    assert torchdoctor.scan(unet).ok
    unet.time_embedding.linear_1.weight.data = unet.time_embedding.linear_1.weight.data.to(torch.bfloat16)
    assert paths(torchdoctor.scan(unet)) == ["time_embedding.linear_1.weight"]


# --- the expected dtype: declared, else a vote no single large tensor can swing -------------------------------


def _big_vocab(name: str) -> nn.Module:
    import transformers

    with zoo._quiet():
        if name == "gemma":
            cfg = transformers.GemmaConfig(vocab_size=4096, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                           bos_token_id=1, eos_token_id=2, pad_token_id=0)
            model = transformers.GemmaForCausalLM(cfg)
        else:
            cfg = transformers.WhisperConfig(vocab_size=4096, d_model=32, encoder_layers=1, decoder_layers=1,
                                             encoder_attention_heads=2, decoder_attention_heads=2,
                                             encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
                                             max_source_positions=16, max_target_positions=16,
                                             decoder_start_token_id=1, pad_token_id=0, bos_token_id=1,
                                             eos_token_id=2)
            model = transformers.WhisperForConditionalGeneration(cfg)
    return model.to(torch.bfloat16).eval()


@pytest.mark.parametrize("name", ["gemma", "whisper"])
@pytest.mark.parametrize("odd", [torch.float32, torch.float64])
def test_tied_embedding_upcast_is_the_one_problem(name: str, odd: torch.dtype) -> None:
    model = _big_vocab(name)
    assert torchdoctor.scan(model).ok
    emb = model.get_input_embeddings()
    assert emb.weight.nbytes * 2 > sum(p.nbytes for p in model.parameters())  # by bytes, it would win the vote
    emb.to(odd)  # the tied lm_head follows: one Parameter
    report = torchdoctor.scan(model)
    assert paths(report) == [next(p for p, t in model.named_parameters() if t is emb.weight)]
    assert report.expected[""]["dtype"] == "bfloat16" and report.expected[""]["dtype_rule"] == "vote"


def test_declared_dtype_decides_and_the_report_says_which(tmp_path) -> None:
    import transformers

    zoo.tiny_llama().save_pretrained(tmp_path)
    with zoo._quiet():
        model = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    report = torchdoctor.scan(model)
    assert report.ok and report.expected[""]["dtype_rule"] == "declared-dtype"
    model.model.layers[0].mlp.down_proj.to(torch.float32)
    report = torchdoctor.scan(model)
    assert paths(report) == ["model.layers.0.mlp.down_proj.weight"]
    assert "config.dtype" in report.problems[0].message


# --- plain attributes and list-held modules are judged against their module --------------------------------


class PosEmbed(nn.Module):
    """A plain tensor attribute used as it is by forward (RT-DETR's ``pos_embed``, old ``self.pe`` code)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.pe = torch.randn(4, 8)
        setattr(self, "pos_embed0", torch.randn(4, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x + self.pe + getattr(self, "pos_embed0"))


class SelfMoving(nn.Module):
    """fairseq-style: the forward moves its attribute to the input first; a cache rebuilt on a device change."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.pe = torch.randn(4, 8)
        self.cache = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.pe = self.pe.to(x.device, x.dtype)
        if self.cache is None or self.cache.device != x.device or self.cache.dtype != x.dtype:
            self.cache = torch.ones(4, 8, device=x.device, dtype=x.dtype)
        return self.proj(x + self.pe * self.cache)


def test_attribute_left_fp32_after_half_is_reported_without_dtype() -> None:
    m = PosEmbed().half()
    report = torchdoctor.scan(m)
    assert sorted(paths(report)) == ["pe", "pos_embed0"]
    assert "Module.to never casts a plain attribute" in report.problems[0].message
    with pytest.raises(RuntimeError):  # what the next forward does
        m(torch.randn(4, 8).half())


def test_attribute_left_on_cpu_after_to_device_is_reported() -> None:
    from torchdoctor._virtual.session import virtual_devices

    with virtual_devices("cuda:1", data="cpu"):
        m = PosEmbed()
        m.to("cuda:1")
        m.pos_embed0 = m.pos_embed0.to("cuda:1")  # the user moved one of the two by hand
        report = torchdoctor.scan(m)
    assert paths(report) == ["pe"]
    assert report.problems[0].found == "cpu" and report.problems[0].expected == "cuda:1"


def test_self_managed_attributes_are_intended() -> None:
    m = SelfMoving()
    m(torch.randn(4, 8))
    m.half()  # pe and cache stay fp32: the forward converts them itself
    assert torchdoctor.scan(m).ok
    m(torch.randn(4, 8).half())  # and it runs


def test_list_held_module_left_behind_is_reported_by_path() -> None:
    class Holder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(8, 8)
            self.refiners = [nn.Linear(8, 8)]

    m = Holder().to(torch.bfloat16)
    report = torchdoctor.scan(m)
    assert sorted(paths(report)) == ["refiners.0.bias", "refiners.0.weight"]


# --- deliberate fp32: bitsandbytes models ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def kbit_llama(tmp_path_factory):
    import peft
    import transformers

    path = tmp_path_factory.mktemp("llama")
    zoo.tiny_llama().save_pretrained(path)
    cfg = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16,
                                          bnb_4bit_quant_type="nf4")
    with zoo._quiet(), pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_DEACTIVATE_ASYNC_LOAD", "1")  # weights loaded in this thread (see tests/move/test_cast_rule.py)
        model = transformers.LlamaForCausalLM.from_pretrained(path, quantization_config=cfg, device_map="cpu",
                                                              dtype=torch.bfloat16)
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    return model


def test_prepare_model_for_kbit_training_fp32_is_intended(kbit_llama) -> None:
    assert kbit_llama.model.norm.weight.dtype == torch.float32  # what peft did on purpose
    assert torchdoctor.scan(kbit_llama, dtype=torch.bfloat16).ok
    assert torchdoctor.scan(kbit_llama).ok


def test_move_plan_agrees_with_scan_on_kbit_fp32(kbit_llama) -> None:
    """move(dtype=bf16) keeps what prepare_model_for_kbit_training made float32, as scan calls it intended."""
    from torchdoctor._move.plan import build, plan

    built = build(kbit_llama, None, torch.bfloat16, True)
    assert dict(built.kept).get("model.norm.weight") == "prepare_model_for_kbit_training keeps it float32"
    assert "model.norm.weight" not in [s.path for s in plan(kbit_llama, dtype=torch.bfloat16)]


def test_kbit_model_with_a_planted_leftover(kbit_llama) -> None:
    w = kbit_llama.model.layers[1].input_layernorm.weight
    saved = w.data
    w.data = saved.double()
    try:
        assert paths(torchdoctor.scan(kbit_llama, dtype=torch.bfloat16)) == ["model.layers.1.input_layernorm.weight"]
    finally:
        w.data = saved


def test_fresh_linear4bit_fp32_bias_is_intended() -> None:
    layer = zoo.bnb_linear4bit()
    assert layer.proj.bias.dtype == torch.float32
    assert torchdoctor.scan(layer, dtype=torch.bfloat16).ok


# --- messages -------------------------------------------------------------------------------------------------


def test_explicit_dtype_message_says_it_was_asked() -> None:
    pipe = zoo.tiny_sd_pipeline()
    pipe.unet.to(torch.bfloat16)
    pipe.text_encoder.to(torch.bfloat16)
    report = torchdoctor.scan(pipe, dtype=torch.bfloat16)
    assert report.problems and all(p.path.startswith("vae.") for p in report.problems)
    msg = report.problems[0].message
    assert "dtype=bfloat16 was asked for" in msg and "'vae' is bfloat16" not in msg


# --- one policy: scan, move's plan, guard and simulate agree -------------------------------------------------


_AGREE = [pytest.param(n, torch.bfloat16, id=f"{n}-bf16") for n in zoo.NAMES] + [
    pytest.param(n, torch.float32, id=f"{n}-fp32") for n in ("llama", "t5", "whisper", "unet", "llama_lora", "clip_text")]


@pytest.mark.parametrize(("name", "dtype"), _AGREE)
def test_scan_plan_guard_and_simulate_agree(name: str, dtype: torch.dtype) -> None:
    from torchdoctor._move.plan import plan
    from torchdoctor._scan.expect import Expectations

    b = zoo.build(name, dtype)
    w = walk(b.obj)
    # no dtype= : scan's expectation per tensor and guard's per module come from the same decisions
    policy = Policy(w, None, None, False)
    guard_view = Expectations(w)
    for e in w.canonical():
        d = policy.decide(e)
        assert d.device_ok(e.tensor.device) and (d.dtype is None or d.dtype_ok(e.tensor.dtype)), (e.path, d)
        if e.role == "parameter" and e.tensor.is_floating_point() and d.dtype is not None:
            assert guard_view.dtype(e.module_path) in (d.dtype, d.alt_dtype), (e.path, d)
    # dtype= given: move casts each tensor to exactly what scan would then expect
    target = torch.float16
    explicit = Policy(w, None, target, False)
    steps = {s.path: s.expected for s in plan(b.obj, dtype=target)}
    for e in w.canonical():
        d = explicit.decide(e)
        if d.dtype is None or not e.tensor.is_floating_point():
            continue
        if e.path in steps:
            assert steps[e.path].startswith(zoo_short(d.dtype)) or d.dtype_ok(e.tensor.dtype), (e.path, d, steps[e.path])
        else:
            assert e.tensor.dtype in (d.dtype, d.alt_dtype), (e.path, d)
    # simulate runs the same model clean on a virtual device: it reads the same policy
    assert torchdoctor.simulate(b.obj, b.inputs, device="cuda:1").ok


def zoo_short(dt: torch.dtype) -> str:
    from torchdoctor._placement import short_dtype

    return short_dtype(dt) + "["


# --- float8 storage: intended behind a casting layer, a leftover in a layer that computes with it -------------------


def _bf16_mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 8), nn.Embedding(4, 8)).to(torch.bfloat16)


@pytest.mark.parametrize("index", [0, 3], ids=["linear", "embedding"])
def test_float8_weight_in_a_plain_torch_layer_is_a_problem(index: int) -> None:
    m = _bf16_mlp()
    m[index].weight.data = m[index].weight.data.to(torch.float8_e4m3fn)
    with pytest.raises(RuntimeError):  # what the forward does with it
        m[2](m[0](torch.ones(1, 8, dtype=torch.bfloat16))) if index == 0 else m[3](torch.tensor([1])) + m[0].weight
    report = torchdoctor.scan(m)
    assert [(p.path, p.found, p.expected) for p in report.problems] == [
        (f"{index}.weight", "float8_e4m3fn", "bfloat16")]
    assert "own forward computes with it" in report.problems[0].message
    assert "enable_layerwise_casting" in report.problems[0].message


def test_move_casts_float8_weights_that_a_torch_layer_computes_with() -> None:
    m = _bf16_mlp()
    m[0].weight.data = m[0].weight.data.to(torch.float8_e4m3fn)
    torchdoctor.move(m, dtype=torch.bfloat16)
    assert m[0].weight.dtype == torch.bfloat16 and torchdoctor.scan(m).ok
    assert m[2](m[0](torch.ones(1, 8, dtype=torch.bfloat16))).dtype == torch.bfloat16
    unet = zoo.build("unet", torch.bfloat16).obj
    unet.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
    stored = {n for n, p in unet.named_parameters() if p.dtype == torch.float8_e4m3fn}
    torchdoctor.move(unet, dtype=torch.bfloat16)  # storage behind a casting layer stays storage
    assert stored and stored == {n for n, p in unet.named_parameters() if p.dtype == torch.float8_e4m3fn}


def test_float8_storage_behind_layerwise_casting_is_intended() -> None:
    unet = zoo.build("unet", torch.bfloat16).obj
    unet.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
    assert any(p.dtype == torch.float8_e4m3fn for p in unet.parameters())
    assert torchdoctor.scan(unet).ok
    m = _bf16_mlp()
    m[0].register_forward_pre_hook(lambda mod, args: None)  # someone upcasts before the forward: not judged
    m[0].weight.data = m[0].weight.data.to(torch.float8_e4m3fn)
    assert torchdoctor.scan(m).ok
