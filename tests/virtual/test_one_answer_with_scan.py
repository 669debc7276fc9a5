"""A virtual run asks scan's policy the one question about a module's own tensors (``_scan.apps.intended_at``): a
buffer its forward moves per call (transformers' rotary ``inv_freq``) and a weight backup kept on the cpu are quiet
in both, and a real leftover is named by both (issues 40 point 4, 41 point 4)."""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

import torchdoctor


def _llama() -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    return LlamaForCausalLM(cfg).eval()


def _run(model: nn.Module, leave: str | None) -> list[tuple[str, str]]:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        model.to("cuda:0")
        model.model.rotary_emb.to("cpu")  # its forward moves inv_freq to the input's device on every call
        if leave:
            model.get_submodule(leave).to("cpu")
        with torch.no_grad():
            model(torch.ones(1, 8, dtype=torch.long, device="cuda:0"))
    return [(p.kind, p.path) for p in sim.problems]


def test_rotary_buffers_left_on_the_cpu_are_quiet_in_a_virtual_run_as_in_scan() -> None:
    model = _llama()
    assert _run(model, None) == []
    assert torchdoctor.scan(model).ok  # the same object, the same answer


def test_a_norm_left_on_the_cpu_beside_them_is_still_named() -> None:
    problems = _run(_llama(), "model.layers.0.input_layernorm")
    assert ("device", "model.layers.0.input_layernorm.weight") in problems
    assert not [p for p in problems if "inv_freq" in p[1]]


def test_a_weight_backup_kept_on_the_cpu_is_quiet_in_a_virtual_run_and_in_scan() -> None:
    # SD.Next's non-fused LoRA: its lora module (not the layer's class) keeps the original weight on the cpu
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        m.to("cuda:0")
        m[0].network_weights_backup = m[0].weight.detach().to("cpu")
        m(torch.ones(2, 8, device="cuda:0"))
        scanned = torchdoctor.scan(m)
    assert sim.problems == [], sim.problems
    assert scanned.ok, scanned.problems
    m[0].stray = m[0].weight.detach().to("cpu")  # the same tensor under another name is still judged
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False):
        assert [p.path for p in torchdoctor.scan(m).problems] == ["0.stray"]


def test_rotary_buffers_left_on_the_cpu_are_quiet_in_simulate_too() -> None:
    def call(model: nn.Module) -> None:
        model.to("cuda:0")
        model.model.rotary_emb.to("cpu")  # as above: moved per call by its own forward
        model.model.norm.to("cpu")  # a real leftover beside it
        model(torch.ones(1, 8, dtype=torch.long, device="cuda:0"))

    report = torchdoctor.simulate(_llama(), device="cuda:0", call=call)
    assert [(p.kind, p.path) for p in report.problems] == [("device", "model.norm.weight")]
