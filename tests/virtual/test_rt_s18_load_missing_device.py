"""A checkpoint whose storages say ``cuda:3`` (saved on a training box's fourth GPU), read without ``map_location``
on a one-GPU machine: ``torch.load`` raises torch's own refusal there, and so does a virtual run with one GPU, at
the program's line (``run`` explains it); ``map_location`` maps it as on the machine, and a run with four virtual
GPUs loads it where it was saved. The same for xpu."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.serialization as ser

import torchdoctor

_MSG = ("Attempting to deserialize object on {T} device 3 but torch.{t}.device_count() is 1. Please use torch.load "
        "with map_location to map your storages to an existing device.")


def _saved_on(path: Path, location: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file as a machine with that device writes it: every storage tagged ``location``."""
    with monkeypatch.context() as m:
        m.setattr(ser, "location_tag", lambda storage: location)
        torch.save({"net": {"weight": torch.ones(2, 4), "bias": torch.zeros(2)}, "step": 1000}, path)


@pytest.mark.parametrize("vtype", ["cuda", "xpu"])
def test_load_on_a_missing_device_index_raises_as_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        vtype: str) -> None:
    f = tmp_path / "ckpt.pt"
    _saved_on(f, f"{vtype}:3", monkeypatch)
    with torchdoctor.virtual_devices(vtype, raise_on_exit=False):
        with pytest.raises(RuntimeError) as err:
            torch.load(f)
        assert str(err.value) == _MSG.format(T=vtype.upper(), t=vtype)
        with pytest.raises(RuntimeError, match="device 3 but"):
            torch.load(f, map_location=f"{vtype}:3")  # an explicit index the machine lacks: the same refusal
        here = torch.load(f, map_location=f"{vtype}:0")["net"]["weight"]
        assert here.device == torch.device(vtype, 0) and torch.equal(here.cpu(), torch.ones(2, 4))
        mapped = torch.load(f, map_location={f"{vtype}:3": f"{vtype}:0"})["net"]["bias"]
        assert mapped.device == torch.device(vtype, 0)
        assert torch.load(f, map_location="cpu")["net"]["weight"].device.type == "cpu"
    with torchdoctor.virtual_devices(f"{vtype}:3", raise_on_exit=False):  # four devices: it loads where it was saved
        assert torch.load(f)["net"]["weight"].device == torch.device(vtype, 3)


def test_run_explains_it_at_the_load_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _saved_on(tmp_path / "ckpt.pt", "cuda:3", monkeypatch)
    (tmp_path / "app.py").write_text(
        "import torch, torch.nn as nn\n"
        "net = nn.Linear(4, 2).to('cuda')\n"
        "ckpt = torch.load('ckpt.pt')\n"
        "net.load_state_dict(ckpt['net'])\n")
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", "app.py"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    out = proc.stdout + proc.stderr
    assert _MSG.format(T="CUDA", t="cuda") in out and "raised at app.py:3" in out
    assert "cuda:3 does not exist" not in out and "the program picked" not in out


def test_a_cuda_checkpoint_in_an_xpu_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "ckpt.pt"
    _saved_on(f, "cuda:0", monkeypatch)
    with torchdoctor.virtual_devices("xpu", raise_on_exit=False):  # an Arc machine has no CUDA
        with pytest.raises(RuntimeError, match=r"^Attempting to deserialize object on a CUDA device but "
                           r"torch\.cuda\.is_available\(\) is False\. If you are running on a CPU-only machine"):
            torch.load(f)
        assert torch.load(f, map_location="xpu")["net"]["weight"].device == torch.device("xpu", 0)
