"""The virtual runtime answers what real code asks of the hardware: memory functions with the real keys, device
properties, the device choice and the environment report, and memory sized from the profile."""

from __future__ import annotations

import gc

import pytest
import torch

import torchdoctor
from torchdoctor._rules.profile import DeviceProfile
from torchdoctor._virtual.session import virtual_devices

# what ComfyUI's model management reads at import and on every model load (re-created, not copied)
KEYS = ("reserved_bytes.all.current", "active_bytes.all.current", "allocated_bytes.all.current",
        "allocated_bytes.all.peak", "requested_bytes.all.current", "num_ooms", "num_alloc_retries")


def _comfy_like_free_memory(dev: torch.device) -> tuple[int, int]:
    """free memory the way ComfyUI computes it: the driver's free plus what torch reserved but is not active."""
    stats = torch.cuda.memory_stats(dev)
    mem_active, mem_reserved = stats["active_bytes.all.current"], stats["reserved_bytes.all.current"]
    free_cuda, _ = torch.cuda.mem_get_info(dev)
    return free_cuda + (mem_reserved - mem_active), torch.cuda.get_device_properties(dev).total_memory


def test_memory_stats_have_the_real_keys_and_follow_what_is_placed() -> None:
    with virtual_devices("cuda:0", profile=DeviceProfile.for_device("cuda", memory=24 * 1024**3)) as sim:
        stats = torch.cuda.memory_stats()
        assert all(stats[k] == 0 for k in KEYS)
        model = torch.nn.Linear(1024, 1024).to("cuda")  # 4 MiB + 4 KiB of fp32
        placed = 1024 * 1024 * 4 + 1024 * 4
        assert torch.cuda.memory_allocated() == placed
        assert torch.cuda.memory_stats(0)["active_bytes.all.current"] == placed
        assert torch.cuda.memory.memory_stats()["allocated_bytes.large_pool.current"] == 1024 * 1024 * 4
        assert torch.accelerator.memory_allocated() == placed
        free, total = _comfy_like_free_memory(torch.device("cuda:0"))
        assert (free, total) == (24 * 1024**3 - placed, 24 * 1024**3)
        model.half()
        gc.collect()
        assert torch.cuda.memory_allocated() == placed // 2  # the fp32 copies are freed
        assert torch.cuda.max_memory_allocated() == placed + 1024 * 1024 * 2  # the fp32 weight freed before the bias is cast
        torch.cuda.reset_peak_memory_stats()
        assert torch.cuda.max_memory_reserved() == placed // 2
        del model
        gc.collect()
        assert torch.cuda.memory_allocated() == 0
        assert "Allocated memory" in torch.cuda.memory_summary()
        nested = torch.cuda.memory_stats_as_nested_dict()
        assert nested["allocated_bytes"]["all"]["peak"] == placed // 2
    assert sim.ok


def test_device_properties_are_the_profiles() -> None:
    with virtual_devices("cuda:1", profile="t4"):
        props = torch.cuda.get_device_properties(1)
        assert (props.major, props.minor) == (7, 5)
        assert props.total_memory == torchdoctor.DeviceProfile.for_device("cuda").memory or props.total_memory > 0
        assert props.name and props.multi_processor_count > 0 and "T4" in repr(props)
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            torch.cuda.get_device_properties(5)


def test_mps_memory_functions() -> None:
    with virtual_devices("mps") as sim:
        x = torch.ones(256, 256, device="mps")
        assert torch.mps.current_allocated_memory() == x.numel() * 4
        assert torch.mps.driver_allocated_memory() >= torch.mps.current_allocated_memory()
        assert torch.mps.recommended_max_memory() == sim.profile.memory


def test_xpu_memory_functions() -> None:
    with virtual_devices("xpu"):
        m = torch.nn.Linear(64, 64).to("xpu")  # held: a module nobody holds is freed, and its bytes with it
        assert torch.xpu.memory_stats()["reserved_bytes.all.current"] == 64 * 64 * 4 + 64 * 4
        assert torch.xpu.mem_get_info()[1] == torch.xpu.get_device_properties().total_memory


def test_a_model_larger_than_the_device_is_a_problem() -> None:
    with torch.device("meta"):  # 17 x 8 GiB in bf16: 136 GiB, on an 80 GiB profile
        model = torch.nn.Sequential(*[torch.nn.Linear(65536, 65536, bias=False) for _ in range(17)])
    report = torchdoctor.simulate(model, device="cuda:0", dtype="bfloat16", assume_device="cpu")
    memory = [p for p in report.problems if p.kind == "memory"]
    assert len(memory) == 1 and not report.ok
    assert "needs 136 GiB on cuda:0, which has 80 GiB" in memory[0].message
    assert report.fix is None  # no cast or move fixes this: the message says what does
    small = torchdoctor.simulate(torch.nn.Linear(4, 4), device="cuda:0", dtype="bfloat16")
    assert small.ok


def test_memory_over_the_profile_in_a_block_is_raised_on_exit() -> None:
    profile = DeviceProfile.for_device("cuda", memory=1024**2)
    with pytest.raises(torchdoctor.PlacementError, match=r"needs 4\.0 MiB on cuda:0, which has 1\.0 MiB"):
        with virtual_devices("cuda:0", profile=profile):
            torch.zeros(1024, 1024, device="cuda")


def test_pick_device_and_capabilities_agree_with_the_virtual_world() -> None:
    before = torchdoctor.pick_device()
    with virtual_devices("cuda:1", profile="t4") as sim:
        assert torchdoctor.pick_device() == torch.device("cuda", 0)
        assert torchdoctor.pick_device("cuda:1") == torch.device("cuda", 1)
        caps = torchdoctor.capabilities("cuda:0")
        assert caps["virtual"] and caps["dtypes"]["bfloat16"]["matmul"]  # capability 7.5: emulated, it runs
        assert not caps["dtypes"]["bfloat16"]["conv"]
        assert torchdoctor.recommend_dtype("cuda:0") == torch.float16
        assert torchdoctor.capabilities("cpu")["dtypes"]["float32"]["matmul"]  # the machine's, not the run's ops
    assert sim.ok and sim.stopped is None
    assert torchdoctor.pick_device() == before


def test_env_report_inside_a_block_does_not_end_it() -> None:
    with virtual_devices("cuda:0") as sim:
        report = torchdoctor.env_report()
        assert report.choice["device"] == "cuda:0" and "virtual cuda" in str(report).splitlines()[0]
        assert torch.cuda.is_available()
        y = torch.nn.Linear(4, 4).to("cuda")(torch.ones(2, 4, device="cuda"))
    assert sim.ok and sim.stopped is None and y.device == torch.device("cuda", 0)


def test_an_object_deepcopy_cannot_copy_is_run_in_place_and_put_back() -> None:
    class Config:  # answers None for unknown attributes, as ComfyUI's model configs do
        def __init__(self) -> None:
            self.unet_config = {"in_channels": 4}

        def __getattr__(self, name: str) -> None:
            return None

    model = torch.nn.Linear(4, 4)
    model.model_config = Config()
    weight = model.weight
    report = torchdoctor.simulate(model, (torch.ones(1, 4),), device="cuda:0")
    assert report.ok and report.forward, report.text()
    assert model.weight is weight and model.weight.device.type == "cpu"
    assert model.weight.device.type == "cpu"
