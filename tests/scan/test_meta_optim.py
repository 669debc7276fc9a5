"""A meta-built model is "weights not loaded" (one line with the way out) and what else is wrong is still named;
optimizer state is judged against its parameter; wrong arguments to assert_placement raise."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor
from support import zoo


def _meta_llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    return model.to(torch.bfloat16)


def test_meta_model_is_one_summary_and_a_planted_fp32_weight_is_still_named() -> None:
    model = _meta_llama()
    report = torchdoctor.scan(model)
    assert [(p.kind, p.path) for p in report.problems] == [("meta", "<root>")]
    msg = report.problems[0].message
    assert msg.startswith("weights not loaded: all 21 parameters") and "assume_device=" in msg
    model.model.layers[1].mlp.down_proj.to(torch.float32)
    report = torchdoctor.scan(model)
    assert [(p.kind, p.path) for p in report.problems] == [
        ("meta", "<root>"), ("dtype", "model.layers.1.mlp.down_proj.weight")]
    assert torchdoctor.scan(model, device="meta").problems[0].path == "model.layers.1.mlp.down_proj.weight"


def test_one_meta_weight_in_a_loaded_model_is_named_by_path() -> None:
    model = zoo.tiny_llama()
    mlp = model.model.layers[0].mlp
    mlp.down_proj.weight = nn.Parameter(mlp.down_proj.weight.to("meta"))
    assert [(p.kind, p.path) for p in torchdoctor.scan(model).problems] == [
        ("meta", "model.layers.0.mlp.down_proj.weight")]


def test_optimizer_state_left_in_another_dtype_is_a_problem_by_path() -> None:
    model = nn.Linear(4, 4)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    assert torchdoctor.scan(opt).ok and torchdoctor.scan({"model": model, "opt": opt}).ok
    model.double()  # the model cast without its optimizer
    with pytest.raises(RuntimeError):
        model(torch.ones(1, 4, dtype=torch.float64)).sum().backward()
        opt.step()
    report = torchdoctor.scan(opt)
    assert sorted(p.path for p in report.problems) == [
        "state.<Parameter 0>.exp_avg", "state.<Parameter 0>.exp_avg_sq",
        "state.<Parameter 1>.exp_avg", "state.<Parameter 1>.exp_avg_sq"]
    assert all(p.found == "float32" and p.expected == "float64" for p in report.problems)
    assert "optimizer state 'exp_avg'" in report.problems[0].message
    assert len(torchdoctor.scan({"model": model, "opt": opt}).problems) == 4


@pytest.mark.parametrize("bad", [None, 3, zoo.tiny_llama], ids=["none", "int", "function"])
def test_assert_placement_refuses_wrong_arguments(bad: object) -> None:
    with pytest.raises(TypeError, match="checks an object that holds tensors"):
        torchdoctor.assert_placement(bad, device="cuda:0")
