"""A network whose modules are patched into the model's layers as their ``forward`` (sd-scripts' LoKr / LoRA) and
kept in float32 while the model runs in bfloat16: one problem for the network, naming the call that made the
tensor (``torch.kron(self.w1, self.w2)``) at its line, from the network's parameters, said to be held apart from
the model; the fix casts the network where it is built. Autograd's own ops in ``loss.backward()`` add nothing."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import torchdoctor


class LoKr(nn.Module):
    def __init__(self, org: nn.Linear) -> None:
        super().__init__()
        self.w1, self.w2 = nn.Parameter(torch.randn(2, 2) * 0.01), nn.Parameter(torch.zeros(4, 4))
        self.org_forward = org.forward
        org.forward = self.forward  # patched in: the model does not hold this module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.org_forward(x) + F.linear(x, torch.kron(self.w1, self.w2))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn, self.mlp = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.relu(self.attn(x)))


def train(m: nn.Module, dtype: torch.dtype | None = None) -> torch.Tensor:
    m.to("cuda:0", torch.bfloat16).requires_grad_(False)
    network = nn.ModuleList([LoKr(m.attn), LoKr(m.mlp)]).to("cuda:0", dtype)  # dtype None: kept float32
    opt = torch.optim.AdamW(network.parameters(), lr=1e-4)
    loss = F.mse_loss(m(torch.randn(2, 8, device="cuda:0", dtype=torch.bfloat16)).float(),
                      torch.zeros(2, 8, device="cuda:0"))
    loss.backward()
    opt.step()
    return loss


def test_a_float32_network_patched_into_a_bf16_model_is_one_problem_naming_its_maker() -> None:
    report = torchdoctor.simulate(Block(), device="cuda:0", dtype=torch.bfloat16, call=train)
    assert len(report.problems) == 1, report.problems
    msg = report.problems[0].message
    line = LoKr.forward.__code__.co_firstlineno + 1
    assert "made by torch.kron in `attn` at " in msg and f"test_patched_network.py:{line} from" in msg, msg
    assert "from attn.forward.__self__.w1 and attn.forward.__self__.w2" in msg
    assert "network.0 as the program holds it, a LoKr patched into attn.forward: the model does not hold it" in msg
    text = str(report)
    assert "network.to(torch.bfloat16)" in text and "4 tensors" in text and "not by the model" in text
    assert "pass the tensors made in float32" not in text and "model.to(torch.bfloat16)" not in text


def test_the_same_network_cast_with_the_model_is_quiet() -> None:
    assert torchdoctor.simulate(Block(), device="cuda:0", dtype=torch.bfloat16,
                                call=lambda m: train(m, torch.bfloat16)).ok
