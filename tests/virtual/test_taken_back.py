"""What a program takes back from a virtual device to the CPU is a real tensor (issue 40, point 2): ``torch.save``,
safetensors, numpy and PIL take it, with the values the run computed (``data="cpu"``) or zeros where it keeps none."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor._virtual.tensor import VirtualTensor


def test_a_tensor_brought_back_saves_with_torch_and_safetensors_and_reads_back(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    with torchdoctor.virtual_devices("cuda") as sim:
        x = torch.randn(2, 3)
        y = (x.to("cuda:0") * 2).to("cpu")
        assert type(y) is torch.Tensor and y.device == torch.device("cpu") and y.shape == (2, 3)
        torch.save({"y": y}, tmp_path / "y.pt")
        save_file({"y": y}, str(tmp_path / "y.safetensors"))
        assert torch.equal(y, x * 2)  # computed on the CPU: the run keeps data
    assert sim.ok
    assert torch.equal(torch.load(tmp_path / "y.pt", weights_only=True)["y"], x * 2)
    assert torch.equal(load_file(str(tmp_path / "y.safetensors"))["y"], x * 2)


@pytest.mark.parametrize("device", ["cuda:1", "xpu", "mps"])
def test_every_way_back_gives_real_values(device: str) -> None:
    from PIL import Image

    with torchdoctor.virtual_devices(device) as sim:
        img = torch.rand(4, 5, 3, device=device)
        back = [img.cpu(), img.to("cpu"), img.to(torch.ones(1)), img.to("cpu", torch.float16), img.type(torch.FloatTensor)]
        ref = img.cpu()
        arr = (img * 255).to(torch.uint8).cpu().numpy()  # a PIL image goes through numpy
        pil = Image.fromarray(arr)
        scalar, listed = img[0, 0, 0].item(), img[0, 0].tolist()
    assert sim.ok, sim.problems
    assert all(type(t) is torch.Tensor and t.device.type == "cpu" and t.shape == (4, 5, 3) for t in back)
    assert back[3].dtype == torch.float16 and back[0].dtype == torch.float32
    assert all(torch.equal(t.float(), ref) for t in back[:3]) and torch.allclose(back[3].float(), ref, atol=1e-3)
    assert pil.size == (5, 4) and np.array_equal(np.asarray(pil), arr)
    assert scalar == pytest.approx(float(ref[0, 0, 0])) and listed == pytest.approx(ref[0, 0].tolist())


def test_torch_save_of_tensors_still_on_the_virtual_device_writes_cpu_tensors(tmp_path: Path) -> None:
    """A checkpoint saved from the device (``torch.save(model.state_dict())``) loads as CPU tensors."""
    from safetensors.torch import load_file, save_file

    with torchdoctor.virtual_devices("cuda:1") as sim:
        model = nn.Linear(3, 2).to("cuda:1")
        sd = model.state_dict()
        assert isinstance(sd["weight"], VirtualTensor)
        buf = io.BytesIO()
        torch.save(sd, buf)
        save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "m.safetensors"))
        want = {k: v.cpu() for k, v in sd.items()}
    assert sim.ok
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    assert {k: (v.device.type, v.shape, v.dtype) for k, v in loaded.items()} == \
        {"weight": ("cpu", (2, 3), torch.float32), "bias": ("cpu", (2,), torch.float32)}
    assert all(torch.equal(loaded[k], want[k]) for k in want)
    assert all(torch.equal(v, want[k]) for k, v in load_file(str(tmp_path / "m.safetensors")).items())


def test_without_values_the_fill_is_zeros() -> None:
    """Where the run keeps no values (a meta run of ``simulate``), what comes back is zeros of the right shape."""
    out: list[torch.Tensor] = []

    def call(m: nn.Module) -> None:
        m.to("cuda:1")
        out.append(m(torch.ones(300, 300, device="cuda:1")).cpu())

    report = torchdoctor.simulate(nn.Linear(300, 300), device="cuda:1", call=call)  # data="meta"
    assert report.ok, report.problems
    [y] = out
    assert type(y) is torch.Tensor and y.shape == (300, 300) and not y.any()


def test_a_cpu_tensor_the_program_makes_stays_real_and_is_still_checked_where_it_meets_the_device() -> None:
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        mask = torch.ones(2, 4)  # made on the cpu and never moved: the planted bug
        assert type(mask) is torch.Tensor and type(mask.half().contiguous()) is torch.Tensor
        y = nn.Linear(4, 4).to("cuda:1")(torch.ones(2, 4, device="cuda:1")) * mask
    assert y.device == torch.device("cuda:1")
    [p] = sim.problems
    assert p.kind == "device" and p.found == "cpu" and "made by torch.ones in code outside the model at" in p.message, p.message
