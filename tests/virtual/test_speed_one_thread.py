"""A meta run computes the few values it keeps (rotary tables, masks, ids) on one intra-op thread: a thread team's
start and its workers' spin cost a busy host far more than such a kernel. The thread setting is the program's again
after every op, and a run with real values (``data="cpu"``) keeps the program's threads for its kernels."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

import torchdoctor

SEEN: list[int] = []


@torch.library.custom_op("tdtest_threads::probe", mutates_args=())
def probe(x: torch.Tensor) -> torch.Tensor:
    SEEN.append(torch.get_num_threads())  # the kernel's own view of the intra-op threads
    return x * 2


@probe.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Rotary(nn.Module):
    """A small table computed in the forward from values the run keeps, then used beside a weight."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.register_buffer("pos", torch.arange(16, dtype=torch.float32), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        table = probe(torch.outer(self.pos, self.pos[:4]).sin())  # 16 x 4: a small tensor with values
        SEEN.append(-torch.get_num_threads())  # the program's own code between ops
        return self.proj(x) + table.sum()


@pytest.fixture
def two_threads() -> Iterator[int]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    SEEN.clear()
    try:
        yield 2
    finally:
        torch.set_num_threads(before)


def test_meta_run_kernels_on_one_thread_program_keeps_its_own(two_threads: int) -> None:
    rep = torchdoctor.simulate(Rotary(), (torch.randn(3, 8),), device="cuda:1", dtype="bfloat16")
    assert rep.ok and rep.data == "meta", rep
    assert SEEN == [1, -two_threads], SEEN  # the kernel on one thread; the program's code sees its own setting
    assert torch.get_num_threads() == two_threads


def test_cpu_values_run_keeps_the_threads(two_threads: int) -> None:
    rep = torchdoctor.simulate(Rotary(), (torch.randn(3, 8),), device="cuda:1", dtype="bfloat16", data="cpu")
    assert rep.ok and rep.data == "cpu", rep
    assert SEEN == [two_threads, -two_threads], SEEN
    assert torch.get_num_threads() == two_threads


def test_a_refused_kernel_puts_the_threads_back(two_threads: int) -> None:
    class Odd(nn.Module):  # a float64 table on mps: the device refuses it, the run records it and goes on
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.arange(4, dtype=torch.float64, device=x.device).sin().float()

    rep = torchdoctor.simulate(Odd(), (torch.randn(4),), device="mps")
    assert rep.problems and torch.get_num_threads() == two_threads, rep
