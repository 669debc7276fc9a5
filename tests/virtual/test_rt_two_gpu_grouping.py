"""A model split over two virtual GPUs and trained with ``clip_grad_norm_`` and a foreach AdamW (a device_map split
with LoRA adapters, huggingface/peft #2787's setup): torch groups the tensors per device in C++, which sees one inner
device for both; the run splits each group by the device the program sees, so the coefficient goes to each device
and the step ends with the numbers of the same program on the cpu, quiet (was a false device problem)."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


def _step(d0: str, d1: str) -> tuple[float, float, float]:
    torch.manual_seed(0)
    a, b = nn.Linear(4, 4).to(d0), nn.Linear(4, 4).to(d1)
    loss = (b(a(torch.randn(2, 4).to(d0)).to(d1)) ** 2).sum() * 100
    loss.backward()
    params = [*a.parameters(), *b.parameters()]
    norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
    torch.optim.AdamW(params, lr=0.1, foreach=True).step()
    return norm.item(), a.weight.sum().item(), b.weight.sum().item()


def test_clipping_and_a_foreach_step_over_two_gpus_agree_with_the_cpu() -> None:
    plain = _step("cpu", "cpu")
    with torchdoctor.virtual_devices("cuda:0", profile=torchdoctor.DeviceProfile.for_device("cuda:1"),
                                     raise_on_exit=False) as sim:
        run = _step("cuda:0", "cuda:1")
    assert sim.ok, sim.problems
    assert all(abs(x - y) < 1e-4 for x, y in zip(plain, run)), (plain, run)


def test_groups_are_split_by_the_device_the_program_sees() -> None:
    from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype

    with torchdoctor.virtual_devices("cuda:0", profile=torchdoctor.DeviceProfile.for_device("cuda:1"),
                                     raise_on_exit=False):
        x, y, z = torch.ones(2, device="cuda:0"), torch.ones(2, device="cuda:1"), torch.ones(2, device="cuda:0")
        groups = _group_tensors_by_device_and_dtype([[x, y, z], []], with_indices=True)
        keys = sorted(str(d) for d, _ in groups)
        assert keys == ["cuda:0", "cuda:1"], groups.keys()
        (lists0, idx0) = groups[(torch.device("cuda:0"), torch.float32)]
        assert idx0 == [0, 2] and lists0[0][1] is z and lists0[1] == []
