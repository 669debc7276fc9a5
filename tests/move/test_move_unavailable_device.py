"""``move`` to a device this machine does not have (issue 42): one clear ``PlacementError`` before anything moves,
saying what to use instead, never torch's bare "Torch not compiled with CUDA enabled".

On a machine that has the device the refusal cannot happen; those cases are skipped there and a GPU test checks the
real move instead.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor import PlacementError
from tests.support.helpers import fingerprint
from tests.support.zoo import tiny_sd_pipeline

HAS_CUDA = torch.cuda.is_available()
HAS_XPU = hasattr(torch, "xpu") and torch.xpu.is_available()
HAS_MPS = torch.backends.mps.is_available()


def _model() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    m.scale = torch.ones(2)  # a tensor Module.to would miss: it must stay where it is too
    return m


@pytest.mark.skipif(HAS_CUDA, reason="this machine has CUDA: nothing to refuse")
@pytest.mark.parametrize("device", ["cuda:1", "cuda", torch.device("cuda", 0)])
def test_cuda_on_a_machine_without_it_is_refused_with_what_to_do(device: object) -> None:
    m = _model()
    before = fingerprint(m)
    with pytest.raises(PlacementError) as info:
        torchdoctor.move(m, device, torch.bfloat16)  # type: ignore[arg-type]
    text = str(info.value)
    name = "cuda:1" if device == "cuda:1" else "cuda:0"
    assert text.startswith(f"move refused, nothing was moved: {name} is not available here (")
    if "+cpu" in torch.__version__:
        assert f"{name} is not available here (CPU-only build of torch {torch.__version__})" in text
    assert "Torch not compiled" not in text
    assert "torchdoctor.move(obj, torchdoctor.pick_device())  # the best device this machine has: cpu" in text
    assert f"with torchdoctor.virtual_devices('{name}'):\n        torchdoctor.move(obj, '{name}')" in text
    assert f"torchdoctor.simulate(obj, inputs, device='{name}')" in text
    assert info.value.fix and "pick_device()" in info.value.fix
    assert fingerprint(m) == before


@pytest.mark.skipif(HAS_CUDA, reason="this machine has CUDA: nothing to refuse")
def test_a_pipeline_with_an_optimizer_is_left_untouched() -> None:
    pipe = tiny_sd_pipeline()
    opt = torch.optim.SGD(pipe.unet.parameters(), lr=0.1, momentum=0.9)
    pipe.unet(torch.randn(1, 4, 8, 8), 1, encoder_hidden_states=torch.randn(1, 4, 8)).sample.sum().backward()
    opt.step()
    before, state = fingerprint(pipe), fingerprint(opt.state)
    with pytest.raises(PlacementError, match=r"^move refused, nothing was moved: cuda:1 is not available here"):
        torchdoctor.move(pipe, "cuda:1")
    assert fingerprint(pipe) == before and fingerprint(opt.state) == state


@pytest.mark.skipif(HAS_XPU, reason="this machine has an XPU")
def test_xpu_is_refused_the_same_way() -> None:
    m = _model()
    with pytest.raises(PlacementError) as info:
        torchdoctor.move(m, "xpu")
    assert str(info.value).startswith("move refused, nothing was moved: xpu:0 is not available here (")
    assert "torchdoctor.virtual_devices('xpu:0')" in str(info.value)
    assert m[0].weight.device.type == "cpu"


@pytest.mark.skipif(HAS_MPS, reason="this machine has MPS")
def test_mps_is_refused_the_same_way() -> None:
    m = _model()
    with pytest.raises(PlacementError, match=r"^move refused, nothing was moved: mps(:0)? is not available here"):
        torchdoctor.move(m, "mps", torch.float16)
    assert m[0].weight.dtype == torch.float32


def test_inside_virtual_devices_the_virtual_gpu_is_there() -> None:
    m = _model()
    with torchdoctor.virtual_devices("cuda:1", count=2):
        report = torchdoctor.move(m, "cuda:1")
        assert m[0].weight.device == torch.device("cuda", 1) and m.scale.device == torch.device("cuda", 1)
        with pytest.raises(PlacementError) as info:
            torchdoctor.move(m, "cuda:3")
    assert report.ok
    assert str(info.value).startswith(
        "move refused, nothing was moved: cuda:3 is not available here (cuda:3 does not exist: 2 cuda device(s) "
        "visible (cuda:0..cuda:1))")


def test_cpu_and_meta_are_never_refused() -> None:
    m = _model()
    torchdoctor.move(m, "cpu", torch.float64)
    torchdoctor.move(m, "meta")
    assert m[0].weight.device.type == "meta"


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_a_cuda_machine_moves_to_its_gpu() -> None:
    m = _model()
    report = torchdoctor.move(m, "cuda:0", torch.bfloat16)
    assert report.ok and m.scale.device == torch.device("cuda", 0) and m[0].weight.dtype == torch.bfloat16
    n = torch.cuda.device_count()
    with pytest.raises(PlacementError, match=rf"cuda:{n} does not exist: {n} cuda device\(s\) visible"):
        torchdoctor.move(m, f"cuda:{n}")
