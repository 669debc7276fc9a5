"""CLI targets for ``torchrun ... -m torchdoctor scan|simulate TARGET --distributed``: each rank builds its own model,
and one rank carries a planted bug chosen by the BUG_RANK / BUG variables of the launch."""

from __future__ import annotations

import os

import torch
from torch import nn

RANK = int(os.environ.get("RANK", "0"))
BUG_RANK = int(os.environ.get("TD_BUG_RANK", "-1"))
BUG = os.environ.get("TD_BUG", "")


class Net(nn.Module):
    """Two linear layers; on the bug rank the forward builds a tensor on cuda:0 whatever its own device is."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        if RANK == BUG_RANK and BUG == "cuda0":
            shift = torch.ones(16, device="cuda:0")  # the planted bug: a hard-coded device instead of h.device
        elif RANK == BUG_RANK and BUG == "dotcuda":
            shift = torch.ones(16).cuda()  # no set_device in this program: the current device is cuda:0 on every rank
        else:
            shift = torch.ones(16, device=h.device)
        return self.out(h + shift)


def model() -> nn.Module:
    torch.manual_seed(0)
    net = Net()
    if RANK == BUG_RANK and BUG == "float64":
        net.out.double()
    if RANK == BUG_RANK and BUG == "raise":
        raise RuntimeError(f"rank {RANK} cannot build its model")
    return net


def target() -> tuple[nn.Module, tuple[torch.Tensor]]:
    return model(), (torch.randn(2, 8),)
