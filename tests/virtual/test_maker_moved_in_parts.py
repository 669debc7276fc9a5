"""A program that moves a model's modules one by one (``for m in model.modules(): if isinstance(m, nn.Linear):
m.to(device)``, as a quantize-then-place helper does) leaves a real peft DoRA adapter's magnitude vector on the cpu:
the proven fix moves it and names the program's line that moved the modules one by one, with the lasting fix (the
model moved as a whole)."""

from __future__ import annotations

import inspect

import torch
from torch import nn

import torchdoctor


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.v, self.out = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.q(x)) + self.v(x))


def _place(model: nn.Module, device: str) -> None:
    for m in model.modules():
        if isinstance(m, nn.Linear):
            m.to(device)


def test_a_dora_magnitude_left_by_a_per_module_move_names_that_line() -> None:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        model = get_peft_model(_Tiny(), LoraConfig(r=4, target_modules=["q", "v"], use_dora=True))
        _place(model, "cuda")
        model(torch.randn(2, 16, device="cuda"))
    assert {p.path for p in sim.problems} == {f"base_model.model.{n}.lora_magnitude_vector.default.weight"
                                              for n in ("q", "v")}
    (fix,) = [f for f in sim.fixes if f.kind == "path"]
    lines, start = inspect.getsourcelines(_place)
    at = f"tests/virtual/test_maker_moved_in_parts.py:{start + next(i for i, ln in enumerate(lines) if 'm.to(' in ln)}"
    assert fix.code.endswith(f"  # {at} moves 7 of the model's modules one by one, never these: move the model "
                             "itself (model.to('cuda:0'))"), fix.code
    assert fix.proven, fix.tried
