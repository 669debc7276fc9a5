"""LoRA adapters attached after the model's move (ComfyUI's TrainLoraNode, Comfy-Org/embedded-docs#65): their CPU
parameters are named by path, and what a layer computes from them is "made from a.adapter.up and a.adapter.down",
never "a tensor made in forward", nor blamed on another layer's adapter (hunt T8)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import torchdoctor


class _Adapter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Parameter(torch.zeros(8, 2))
        self.down = nn.Parameter(torch.randn(2, 8) * 0.01)


class _Patched(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if getattr(self, "adapter", None) is not None:
            w = w + (self.adapter.up @ self.adapter.down).to(w.dtype)
        return F.linear(x, w, self.bias)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = _Patched(8, 8), _Patched(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.silu(self.a(x)))


def _train(moved: bool) -> torchdoctor.VirtualSession:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        m = _Net().to("cuda:0").requires_grad_(False)
        for lin in (m.a, m.b):
            lin.adapter = _Adapter().to("cuda:0") if moved else _Adapter()  # the bug: left on cpu
        opt = torch.optim.AdamW([p for lin in (m.a, m.b) for p in lin.adapter.parameters()], lr=1e-3)
        m(torch.randn(2, 8, device="cuda:0")).square().mean().backward()
        opt.step()
    return sim


def test_adapter_parameters_left_on_cpu_are_named_by_path() -> None:
    sim = _train(moved=False)
    paths = {p.path for p in sim.problems if p.kind == "device"}
    assert {"a.adapter.up", "a.adapter.down", "b.adapter.up", "b.adapter.down"} <= paths
    assert not any("a tensor made in forward" in p.message for p in sim.problems)
    [made_a] = [p for p in sim.problems if p.path == "a"]
    assert "a tensor made by Tensor.matmul in `a` from a.adapter.up and a.adapter.down f32[8,8]@cpu is on cpu " \
           "while aten.add.Tensor runs on cuda:0" in made_a.message
    assert "b.adapter" not in made_a.message


def test_adapters_moved_with_the_model_train_quietly() -> None:
    sim = _train(moved=True)
    assert sim.ok and not sim.problems
