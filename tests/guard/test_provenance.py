"""Blame the culprit: guard names the model tensor that caused a failure, by path, before the op where it
surfaced (explain and strict modes, real transformers models on CPU)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor
from support import zoo

BF = torch.bfloat16


def _fail(model: nn.Module, call: object, mode: str) -> torchdoctor.PlacementError:
    with pytest.raises(torchdoctor.PlacementError) as info:
        with torchdoctor.guard(model, mode=mode):
            call()  # type: ignore[operator]
    return info.value


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_tied_lm_head_upcast_names_the_embedding_first(mode: str) -> None:
    b = zoo.build("llama", BF)
    b.obj.get_input_embeddings().to(torch.float32)  # the LlamaFactory#5583 pattern: tied lm_head follows
    err = _fail(b.obj, lambda: b.call(b.obj), mode)
    first = str(err).splitlines()[0]
    assert err.problems[0].path == "model.embed_tokens.weight"
    assert first.index("`model.embed_tokens.weight`") < first.index("model.layers.0.self_attn.q_proj")
    assert "float32 entered at `model.embed_tokens`" in first
    assert "model.model.embed_tokens.weight.data = model.model.embed_tokens.weight.data.to(torch.bfloat16)" \
        in (err.fix or "")


class _Encoder(nn.Module):
    """RT-DETR style: the positional embedding is a plain attribute set with setattr, added to queries/keys."""

    def __init__(self) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.norm = nn.LayerNorm(8)
        setattr(self, "pos_embed", torch.randn(1, 4, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = k = x + getattr(self, "pos_embed")
        return self.norm(self.self_attn(q, k, x)[0])


class _Detr(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.encoder = _Encoder()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.proj(x))


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_attribute_left_fp32_after_half_is_named_not_the_attention_inputs(mode: str) -> None:
    model = _Detr().to(BF)  # pos_embed stays float32: Module.to never casts a plain attribute
    x = torch.randn(2, 4, 8, dtype=BF)
    err = _fail(model, lambda: model(x), mode)
    assert err.problems[0].path == "encoder.pos_embed"
    head = str(err).splitlines()[0]
    if mode == "explain":
        assert head.startswith("dtype mismatch caused by `encoder.pos_embed`"), head
    else:  # strict: at the add where the float32 attribute promoted the bf16 data, the attribute by path
        assert head.startswith("dtype problem in `encoder` (_Encoder) at aten.add.Tensor: arg 1 (other) is float32 "
                               "and promotes the model's bfloat16"), head
        assert "culprit encoder.pos_embed = arg 1 (other)" in str(err)


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_clip_position_embedding_upcast_is_named_before_layer_norm1(mode: str) -> None:
    b = zoo.build("clip_text", BF)
    emb = b.obj.embeddings.position_embedding
    emb.to(torch.float32)
    err = _fail(b.obj, lambda: b.call(b.obj), mode)
    assert err.problems[0].path == "embeddings.position_embedding.weight"
    assert "encoder.layers.0" in str(err).splitlines()[0]


def test_a_correct_model_with_a_wrong_input_still_blames_the_input() -> None:
    b = zoo.build("llama", BF)
    model = torch.nn.Linear(4, 4).to(BF)
    err = _fail(model, lambda: model(torch.randn(2, 4)), "explain")
    # Linear.forward(input); (the report's patch of this file quotes this test's own lines: the headline is judged)
    assert err.problems[0].path == "input" and "caused by" not in str(err).splitlines()[0]
    assert (err.fix or "").startswith("err = _fail(model, lambda: model(torch.randn(2, 4, dtype=torch.bfloat16)), ")
    assert b.obj is not None


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = torch.ones(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x * self.scale)


def test_compiled_model_first_compiled_outside_the_guard_names_the_model_path() -> None:
    model = _Scaled().to(BF)
    model.scale = torch.ones(4, dtype=BF)
    compiled = torch.compile(model, backend="eager")
    x = torch.randn(2, 4, dtype=BF)
    compiled(x)  # the first compile happens outside the guard (scale is bf16 yet)
    model.scale = torch.ones(4)  # then a float32 attribute replaces it: the recompiled graph holds it as a constant
    err = _fail(compiled, lambda: compiled(x), "explain")
    text = str(err)
    assert "GraphModule outside the guarded model" not in text and "_tensor_constant" not in text
    assert err.problems[0].path == "scale"
    assert "model.scale.data = model.scale.data.to(torch.bfloat16)" in (err.fix or "")


def test_scan_of_a_compiled_model_has_the_models_paths() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model[0].bias.data = model[0].bias.data.double()
    report = torchdoctor.scan(torch.compile(model, backend="eager"))
    assert [p.path for p in report.problems] == ["0.bias"]
    assert not any("_orig_mod" in t.path for t in report.tensors)


class _Fp8Embed(nn.Module):
    """An fp8 embedding table used in bf16 math: torch refuses the promotion on every device."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 4)
        self.emb.weight.data = self.emb.weight.data.to(torch.float8_e4m3fn)
        self.scale = nn.Parameter(torch.ones(4, dtype=BF))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.emb(ids) * self.scale


def test_fp8_table_in_bf16_math_is_a_problem_by_path_and_fix_mode_runs() -> None:
    m = _Fp8Embed()
    ids = torch.tensor([1, 2])
    err = _fail(m, lambda: m(ids), "explain")
    assert [(p.path, p.found, p.expected) for p in err.problems] == [("emb.weight", "float8_e4m3fn", "bfloat16")]
    assert "model.emb.weight.data = model.emb.weight.data.to(torch.bfloat16)" in (err.fix or "")
    strict = _fail(m, lambda: m(ids), "strict")
    assert strict.problems and "Promotion for Float8" in str(strict)
    with torchdoctor.guard(m, mode="fix") as g:
        out = m(ids)
    assert out.dtype == BF and g.fixes


def test_warn_mode_points_at_the_users_line() -> None:
    b = zoo.build("llama", BF)
    b.obj.get_input_embeddings().to(torch.float32)
    with pytest.warns(torchdoctor.PlacementWarning) as record, torchdoctor.guard(b.obj, mode="warn"):
        b.obj(**b.inputs)  # the line the warning names
    assert record[0].filename == __file__, record[0].filename


def test_fix_mode_aligns_attention_the_composite_would_refuse() -> None:
    """scaled_dot_product_attention compares q/k/v dtypes in C++ before any aten op is dispatched: fix and warn
    align it one level up, so the run goes on (transformers' sdpa attention, fp32 embedding in a bf16 Llama)."""
    b = zoo.build("llama", BF)
    b.obj.get_input_embeddings().to(torch.float32)
    with torch.no_grad(), torchdoctor.guard(b.obj, mode="fix") as g:
        out = b.obj(**b.inputs)
    assert out.logits.dtype == BF
    sdpa = [p for p in g.fixes if p.op == "aten.scaled_dot_product_attention.default"]
    assert [(p.module_path, p.found, p.expected) for p in sdpa[:2]] == [
        ("model.layers.0.self_attn", "float32", "bfloat16")] * 2
    assert {p.path.split(": ")[-1] for p in sdpa} == {"arg 0 (query)", "arg 1 (key)"}


class _Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.v = nn.Parameter(torch.ones(1, 2, 4, 8, dtype=BF))

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, q, value=self.v)


def test_warn_mode_aligns_sdpa_called_with_keywords() -> None:
    m = _Attn()
    q = torch.ones(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="same dtype"):
        m(q)
    with pytest.warns(torchdoctor.PlacementWarning, match=r"scaled_dot_product_attention.*aligned for this call"), \
            torchdoctor.guard(m, mode="warn"):
        out = m(q)
    assert out.shape == (1, 2, 4, 8)
