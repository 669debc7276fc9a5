"""A process group's collectives in a virtual run refuse the devices its backend cannot move, as on the machine: gloo
moves cpu and cuda tensors only, so DDP over a one-process gloo group with the model on mps stops in its constructor
on a Mac (``ProcessGroupGloo::allgather: invalid tensor type ... device=mps:0``). Before, the virtual run handed gloo
the virtual tensors' host storage and the program trained to its end: a false all-clear. The refusal names the line
that made the process group and the backend it asked for. Real gloo groups (one process, a file store); each test
destroys its group."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import torchdoctor

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo here")


@contextlib.contextmanager
def _gloo_group() -> Iterator[None]:
    store = tempfile.NamedTemporaryFile(delete=False)
    store.close()
    try:
        dist.init_process_group("gloo", init_method=f"file://{store.name}", rank=0, world_size=1)  # MADE_HERE
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        with contextlib.suppress(FileNotFoundError):  # (the file store removes it itself)
            os.unlink(store.name)


def _line(marker: str) -> int:
    lines = open(__file__).read().splitlines()
    return next(i for i, text in enumerate(lines, 1) if marker in text and "next(" not in text)


def test_ddp_over_gloo_with_the_model_on_mps_is_refused_with_gloos_text_and_the_groups_line() -> None:
    with torchdoctor.virtual_devices("mps", raise_on_exit=False), _gloo_group():
        model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 1)).to("mps")
        with pytest.raises(RuntimeError) as info:
            DDP(model)
    text = str(info.value)
    assert text.startswith("ProcessGroupGloo::allgather: invalid tensor type at index 0")
    assert "device=mps:0" in text and "device=cpu" in text
    assert f"made at test_collective_backend.py:{_line('MADE_HERE')} with backend='gloo'" in text
    assert "'gloo' for cpu, 'nccl' for cuda" in text and "on mps run one process without a process group" in text


def test_a_gloo_all_reduce_takes_cpu_and_cuda_tensors_and_refuses_xpu() -> None:
    with torchdoctor.virtual_devices("xpu", raise_on_exit=False), _gloo_group():
        t = torch.ones(3)
        dist.all_reduce(t)  # the program's own cpu tensor: gloo's, for real
        assert t.tolist() == [1.0, 1.0, 1.0]
        with pytest.raises(RuntimeError, match=r"^ProcessGroupGloo::allreduce: unsupported device type xpu"):
            dist.all_reduce(torch.ones(3, device="xpu"))


def test_ddp_over_gloo_on_cuda_is_not_refused() -> None:
    """gloo moves cuda tensors: the same DDP on a (virtual) cuda model builds, as it does on a GPU machine."""
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as run, _gloo_group():
        model = nn.Linear(8, 1).to("cuda")
        ddp = DDP(model)
        loss = ddp(torch.randn(4, 8, device="cuda")).pow(2).mean()
        assert loss.device.type == "cuda"
    assert run.problems == []


def test_nccl_asked_in_a_virtual_cuda_run_builds_ddp_and_refuses_cpu_tensors_as_nccl_does() -> None:
    """A GPU build has NCCL, this CPU build has not: the group the program asked for carries the run (gloo stands in
    for it), and a collective on a cpu tensor is refused as an nccl group refuses it."""
    store = tempfile.NamedTemporaryFile(delete=False)
    store.close()
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as run:
        try:
            dist.init_process_group("nccl", init_method=f"file://{store.name}", rank=0, world_size=1)
            model = nn.Linear(8, 1).to("cuda")
            ddp = DDP(model, device_ids=[0])
            loss = ddp(torch.randn(4, 8, device="cuda")).pow(2).mean()
            loss.backward()
            assert model.weight.grad is not None and model.weight.grad.device.type == "cuda"
            with pytest.raises(RuntimeError, match=r"^No backend type associated with device type cpu"):
                dist.all_reduce(torch.ones(2))
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(store.name)
    assert run.problems == []
