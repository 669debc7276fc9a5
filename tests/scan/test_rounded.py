"""A model-wide cast rounds a computed float32 buffer its forward upcasts on every call (RoPE ``inv_freq``): scan notes
it (``report.extra["notes"]``, the model still runs), with the fix, on transformers' rotary classes and on a user's
own; a float32 one, a persistent one, and one the forward casts to the input's dtype give no note; ``move`` to a
16-bit dtype keeps it float32, as ``from_pretrained(dtype=...)`` does (``keep_fp32=False``: as ``Module.to``)."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor
from torchdoctor._scan.rounded import upcast_at_use

BF16 = torch.bfloat16


def _llama(cast: torch.dtype | None = None, built: torch.dtype | None = None) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    if built is not None:
        torch.set_default_dtype(built)  # as from_pretrained(dtype=...) builds it
    try:
        model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(torch.float32)
    return model.to(cast) if cast is not None else model


def _rounded(report: torchdoctor.ScanReport) -> list[tuple[str, str, str]]:
    assert report.ok, report.problems  # a note, never a problem
    return [(n["path"], n["found"], n["expected"]) for n in report.extra.get("notes", [])]


def test_a_cast_llama_notes_its_rounded_inv_freq_with_a_proven_fix() -> None:
    model = _llama(cast=BF16)
    report = torchdoctor.scan(model)
    assert _rounded(report) == [("model.rotary_emb.inv_freq", "bfloat16", "float32")]
    [note] = report.extra["notes"]
    assert (note["kind"], note["role"], note["module_type"]) == ("dtype", "buffer", "LlamaRotaryEmbedding")
    msg = note["message"]
    assert "LlamaRotaryEmbedding's own forward computes with it in float32 on every call" in msg
    assert "a model-wide cast (.to(torch.bfloat16), .half()) rounded its values" in msg
    assert "from_pretrained(..., dtype=torch.bfloat16) keeps it float32" in msg
    fix = ("model.model.rotary_emb.inv_freq = type(model.model.rotary_emb)(model.model.rotary_emb.config).inv_freq"
           ".to(model.model.rotary_emb.inv_freq.device)")
    assert fix in msg and "(fix proven:" in msg
    assert report.to_dict()["notes"] == report.extra["notes"]  # the JSON report carries it
    text = report.text()  # and the text says it, after the all-clear it does not change
    assert text.startswith("ok: no placement problems") and "\nnote: model.rotary_emb.inv_freq: bf16[4]@cpu" in text
    # the printed fix, applied, gives float32 values the stored ones round to, and the note goes
    before = model.model.rotary_emb.inv_freq.clone()
    exec(fix, {"model": model})
    after = model.model.rotary_emb.inv_freq
    assert after.dtype == torch.float32 and torch.equal(after.to(BF16), before)
    assert _rounded(torchdoctor.scan(model)) == []
    assert _rounded(torchdoctor.scan(_llama(cast=BF16), dtype="bfloat16")) == [
        ("model.rotary_emb.inv_freq", "bfloat16", "float32")]


def test_move_to_16_bits_keeps_it_float32_as_from_pretrained_does() -> None:
    model = _llama()
    report = torchdoctor.move(model, dtype=torch.float16)
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == torch.float16
    assert "its forward computes with it in float32" in str(report)
    assert _rounded(torchdoctor.scan(model)) == []
    plain = _llama()
    torchdoctor.move(plain, dtype=torch.float16, keep_fp32=False)  # Module.to's cast, bit for bit
    assert plain.model.rotary_emb.inv_freq.dtype == torch.float16
    assert _rounded(torchdoctor.scan(plain)) == [("model.rotary_emb.inv_freq", "float16", "float32")]


def test_a_llama_built_in_bf16_or_kept_in_fp32_is_quiet() -> None:
    built = _llama(built=BF16)
    assert built.model.rotary_emb.inv_freq.dtype == torch.float32
    assert _rounded(torchdoctor.scan(built)) == [] and _rounded(torchdoctor.scan(built, dtype="bfloat16")) == []
    assert _rounded(torchdoctor.scan(_llama())) == []


def test_a_second_family_in_half_is_found() -> None:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=2)
    report = torchdoctor.scan(GPTNeoXForCausalLM(cfg).half())
    assert _rounded(report) == [("gpt_neox.rotary_emb.inv_freq", "float16", "float32")]
    msg = report.extra["notes"][0]["message"]
    assert "GPTNeoXRotaryEmbedding" in msg and "(fix proven:" in msg


class Rope(nn.Module):
    """A user's own rotary table: computed in float32 when built, upcast in forward."""

    def __init__(self, dim: int = 8, persistent: bool = False) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim)),
                             persistent=persistent)

    def forward(self, pos: torch.Tensor) -> torch.Tensor:
        f = self.inv_freq[None, :]
        return pos[:, None].float() * f.float()


class RopeInputDtype(Rope):
    def forward(self, pos: torch.Tensor) -> torch.Tensor:
        return pos[:, None] * self.inv_freq.to(pos.dtype)


def _net(rope: nn.Module) -> nn.Module:
    return nn.Sequential(nn.Linear(8, 8), rope)


def test_a_users_own_rotary_buffer_rounded_by_a_cast() -> None:
    assert upcast_at_use(Rope) == frozenset({"inv_freq"})
    report = torchdoctor.scan(_net(Rope()).to(BF16))
    assert _rounded(report) == [("1.inv_freq", "bfloat16", "float32")]
    msg = report.extra["notes"][0]["message"]
    assert "Rope's own forward computes with it in float32" in msg
    assert "copy = model.1.inv_freq.clone() before the cast" in msg and "fix unproven:" in msg
    assert _rounded(torchdoctor.scan(_net(Rope()))) == []  # float32: fine


def test_quiet_where_nothing_was_rounded_or_nothing_wants_float32() -> None:
    assert _rounded(torchdoctor.scan(_net(Rope(persistent=True)).to(BF16))) == []  # loaded as it was saved
    assert upcast_at_use(RopeInputDtype) == frozenset()
    assert _rounded(torchdoctor.scan(_net(RopeInputDtype()).to(BF16))) == []  # computes in the input's dtype

    class LlamaRotaryEmbedding(Rope):  # transformers' class name, a forward that never upcasts: read from the code
        def forward(self, pos: torch.Tensor) -> torch.Tensor:
            return pos[:, None] * self.inv_freq

    assert _rounded(torchdoctor.scan(_net(LlamaRotaryEmbedding()).to(BF16))) == []
