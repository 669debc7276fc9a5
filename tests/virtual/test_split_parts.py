"""A model the program splits over two GPUs itself (LLaVA-style: the vision tower and projector on cuda:1, the
language model on cuda:0; lmms-eval#643): no part is "not moved", the one problem is the projector's
``image_features`` on cuda:1 scattered into ``inputs_embeds`` on cuda:0, named at its line, with the move to the
other operand's device at that line as its fix; the same program that moves it is quiet."""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaModel

import torchdoctor
from torchdoctor._virtual.makers import operand_fix
from torchdoctor._virtual.origin import LINES


class TinyVLM(nn.Module):
    def __init__(self, moved: bool = False) -> None:
        super().__init__()
        self.vision = nn.Sequential(nn.Linear(12, 16), nn.GELU())
        self.projector = nn.Linear(16, 32)
        self.language_model = LlamaModel(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                     num_hidden_layers=1, num_attention_heads=4,
                                                     num_key_value_heads=2))
        self.moved = moved

    def forward(self, input_ids: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
        image_features = self.projector(self.vision(pixels))
        inputs_embeds = self.language_model.embed_tokens(input_ids)
        mask = (input_ids == 5).unsqueeze(-1).expand_as(inputs_embeds)
        if self.moved:
            image_features = image_features.to(inputs_embeds.device)
        inputs_embeds = inputs_embeds.masked_scatter(mask, image_features)
        return self.language_model(inputs_embeds=inputs_embeds).last_hidden_state


def app(m: nn.Module) -> torch.Tensor:
    m.vision.to("cuda:1")
    m.projector.to("cuda:1")
    m.language_model.to("cuda:0")  # a device map by hand
    ids = torch.tensor([[1, 5, 5, 7]], device="cuda:0")
    with torch.no_grad():
        return m(ids, torch.randn(1, 2, 12, device="cuda:1"))


LINE = TinyVLM.forward.__code__.co_firstlineno + 6


def test_the_operand_between_the_parts_is_the_one_problem() -> None:
    report = torchdoctor.simulate(TinyVLM(), device="cuda:1", call=app)
    assert len(report.problems) == 1, str(report)
    msg = report.problems[0].message
    at = msg.split(" ", 3)[2]  # file:line as reports write it
    assert at.endswith(f"test_split_parts.py:{LINE}") and msg.startswith(f"image_features at {at} (a tensor made by "), msg
    assert "bf16" not in msg and "f32[1,2,32]@cuda:1 is on cuda:1 while aten.masked_scatter.default runs on cuda:0" \
        in msg, msg
    assert "not moved" not in str(report)
    fixed = operand_fix(f"operand image_features at {at}", torch.device("cuda:0"))
    assert fixed is not None and fixed[0] == \
        "inputs_embeds = inputs_embeds.masked_scatter(mask, image_features.to(inputs_embeds.device))", fixed
    assert LINES[at][1] == LINE


def test_virtual_devices_names_the_same_operand() -> None:
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        app(TinyVLM())
    assert len(sim.problems) == 1 and sim.problems[0].message.split(" (", 1)[0].endswith(
        f"test_split_parts.py:{LINE}"), [p.message for p in sim.problems]
    assert sim.problems[0].message.startswith("image_features at "), sim.problems[0].message


def test_the_split_that_moves_it_is_quiet() -> None:
    assert torchdoctor.simulate(TinyVLM(moved=True), device="cuda:1", call=app).ok
