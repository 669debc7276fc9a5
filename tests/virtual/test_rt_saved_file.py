"""A file a virtual run wrote with ``torch.save`` from device tensors, read back in the same run without
``map_location``, gives its tensors back on the devices they were saved from, as ``torch.load`` does on a GPU
machine (so ``.numpy()`` of one is the error it is there); the file itself holds CPU tensors and loads anywhere."""

from __future__ import annotations

import io
from pathlib import Path

import torch

import torchdoctor


def test_read_back_in_the_run_lands_where_it_was_saved(tmp_path: Path) -> None:
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as s:
        lat = torch.randn(1, 4, 2, 2, device="cuda:1")
        mask = torch.ones(3)  # a CPU tensor in the same file stays on the CPU
        buf = io.BytesIO()
        torch.save({"latents": lat, "mask": mask}, buf)
        torch.save({"latents": lat}, tmp_path / "c.pt")
        buf.seek(0)
        cache = torch.load(buf)
        again = torch.load(tmp_path / "c.pt")
        assert cache["latents"].device == torch.device("cuda:1") and cache["mask"].device.type == "cpu"
        assert again["latents"].device == torch.device("cuda:1")
        assert torch.equal(cache["latents"].cpu(), lat.cpu())
        buf.seek(0)
        assert torch.load(buf, map_location="cpu")["latents"].device.type == "cpu"  # map_location still decides
        cache["latents"].numpy()  # on a GPU machine: can't convert cuda:1 device type tensor to numpy
    assert [p.kind for p in s.problems] == ["device"]
    assert torch.load(tmp_path / "c.pt")["latents"].device.type == "cpu"  # after the run: loads anywhere
