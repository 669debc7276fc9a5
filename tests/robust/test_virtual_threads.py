"""Virtual devices belong to the thread that runs them and to the threads it starts; the rest of the process sees
the real machine; concurrent simulations in different threads each work; global settings come back."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor._virtual.session import virtual_devices
from support import zoo
from support.guarded import guarded


def _guarded(fn: Any, timeout: float = 300.0) -> Any:
    return guarded(fn, timeout)


def test_other_threads_see_the_real_machine_while_threads_started_by_the_run_see_the_simulation() -> None:
    outside: list[bool] = []
    started: list[bool] = []
    pooled: list[Any] = []
    go, seen = threading.Event(), threading.Event()

    def bystander() -> None:  # started before the run: not part of it
        go.wait(30)
        outside.append(torch.cuda.is_available())
        seen.set()

    th = threading.Thread(target=bystander)
    th.start()
    with virtual_devices("cuda:0") as sim:
        go.set()
        seen.wait(30)

        def child() -> None:
            started.append(torch.cuda.is_available())

        t2 = threading.Thread(target=child)
        t2.start()
        t2.join()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            pooled.extend(pool.map(lambda i: (torch.cuda.is_available(), torch.ones(2).to("cuda:0").device), [0, 1]))
        assert torch.cuda.is_available()
    th.join()
    assert sim.ok
    assert outside == [False]
    assert started == [True]
    assert pooled == [(True, torch.device("cuda", 0))] * 2
    assert not torch.cuda.is_available()


def test_a_pool_made_before_the_run_serves_it_and_afterwards_the_real_machine() -> None:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert pool.submit(torch.cuda.is_available).result() is False
        with virtual_devices("cuda:0"):
            assert pool.submit(torch.cuda.is_available).result() is True
        assert pool.submit(torch.cuda.is_available).result() is False


def test_four_concurrent_simulations_in_four_threads_all_work() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    model[2].bias.data = model[2].bias.data.to(torch.float64)  # one dtype problem each run must report
    barrier = threading.Barrier(4)

    def one(i: int) -> Any:
        barrier.wait(30)
        return torchdoctor.simulate(model, (torch.randn(3, 8),), device=f"cuda:{i % 2}",
                                    profile=torchdoctor.DeviceProfile.for_device("cuda").with_count(2))

    def run_all() -> list[Any]:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            return list(pool.map(one, range(4)))

    reports = _guarded(run_all)
    for r in reports:
        assert [(p.kind, p.path) for p in r.problems] == [("dtype", "2.bias")], r.text()
    assert not torch.cuda.is_available()


def test_default_dtype_and_process_settings_do_not_outlive_the_run() -> None:
    def call(m: nn.Module) -> None:
        torch.set_default_dtype(torch.float64)
        torch.set_float32_matmul_precision("medium")
        m.to("cuda:0")

    before = torch.get_float32_matmul_precision()
    torchdoctor.simulate(nn.Linear(2, 2), device="cuda:0", call=call)
    assert torch.get_default_dtype() == torch.float32
    assert torch.get_float32_matmul_precision() == before
    with pytest.raises(ZeroDivisionError):
        with virtual_devices("cuda:0"):
            torch.set_default_dtype(torch.float16)
            raise ZeroDivisionError
    assert torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize("data", ["meta", "cpu"])
def test_legacy_type_strings_and_constructors_answer_as_the_device(data: str) -> None:
    def call(m: nn.Module) -> None:
        x = torch.ones(2, 3, device="cuda:1")
        assert x.type() == "torch.cuda.FloatTensor"
        assert x.half().type() == "torch.cuda.HalfTensor"
        y = torch.zeros(2, 3).type(x.type())  # the idiom that failed: a CPU tensor to the other's type
        assert (y.device, y.dtype) == (torch.device("cuda", 0), torch.float32)  # the current device, as on CUDA
        z = x.type("torch.cuda.HalfTensor")
        assert (z.device, z.dtype) == (torch.device("cuda", 1), torch.float16)
        assert x.type(torch.float64).device == torch.device("cuda", 1)
        assert x.type("torch.FloatTensor").device == torch.device("cpu")
        w = torch.cuda.FloatTensor(4)
        assert (w.device.type, w.dtype, tuple(w.shape)) == ("cuda", torch.float32, (4,))
        h = torch.cuda.HalfTensor([1.0, 2.0])
        assert h.dtype == torch.float16 and h.is_cuda and h.get_device() == 0
        assert isinstance(h, torch.cuda.HalfTensor)
        assert x.is_cuda and x.get_device() == 1 and not torch.ones(1).is_cuda

    r = torchdoctor.simulate(nn.Linear(2, 2), device="cuda:1", call=call, data=data,
                             profile=torchdoctor.DeviceProfile.for_device("cuda").with_count(2))
    assert r.ok, r.text()
    with pytest.raises(Exception, match="not available|not compiled"):  # outside: the real (CPU) build again
        torch.cuda.FloatTensor(2)


def test_from_pretrained_with_device_map_auto_loads_in_worker_threads_inside_a_virtual_run(tmp_path: Any) -> None:
    transformers = pytest.importorskip("transformers")
    zoo.tiny_llama().save_pretrained(tmp_path)

    def load() -> Any:
        with virtual_devices("cuda:0") as sim:
            model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, device_map="auto")
            out = model(torch.tensor([[1, 2, 3]], device="cuda:0"))
            return sim, model, out

    sim, model, out = _guarded(load)
    assert sim.ok
    assert {p.device for p in model.parameters()} == {torch.device("cuda", 0)}
    assert out.logits.device == torch.device("cuda", 0)
