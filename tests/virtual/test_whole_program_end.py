"""A training program runs to its end on a virtual GPU: backward, clip, optimizer and scheduler steps, the numbers
it takes back (``.item()``, ``.tolist()``, ``.numpy()``), what it saves (numpy, ``torch.save``, an image) and a
checkpoint loaded back with ``map_location="cuda"`` (torch alone raises ``Storage device not recognized: cuda``
on a machine without one); every value it keeps is real."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchdoctor


def test_a_training_program_runs_to_its_end(tmp_path: Path) -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to("cuda")
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, 1)
        x, y = torch.randn(16, 4, device="cuda"), torch.randint(0, 2, (16,), device="cuda")
        losses = []
        for _ in range(3):
            loss = nn.functional.cross_entropy(m(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        with torch.no_grad():
            out = m(x).softmax(-1)
        rows, arr = out[:2].tolist(), out.cpu().numpy()
        np.save(tmp_path / "out.npy", arr)
        torch.save({"model": m.state_dict(), "opt": opt.state_dict()}, tmp_path / "ck.pt")
        (tmp_path / "m.json").write_text(json.dumps({"loss": losses, "rows": rows}))
        back = torch.load(tmp_path / "ck.pt", map_location="cuda")
        where = {t.device for t in back["model"].values()}
        m.load_state_dict(back["model"])
        opt.load_state_dict(back["opt"])
        on_cpu = torch.load(tmp_path / "ck.pt", map_location={"cuda:0": "cpu"})["model"]["0.weight"]
    assert sim.ok and not sim.problems and sim.failure is None
    assert len(losses) == 3 and all(isinstance(v, float) for v in losses)
    assert isinstance(arr, np.ndarray) and arr.shape == (16, 2) and np.allclose(arr.sum(-1), 1, atol=1e-5)
    assert np.load(tmp_path / "out.npy").shape == (16, 2) and len(json.loads((tmp_path / "m.json").read_text())["rows"]) == 2
    assert where == {torch.device("cuda:0")} and on_cpu.device == torch.device("cpu")
    saved = torch.load(tmp_path / "ck.pt")["model"]["0.weight"]  # after the run: real values on the CPU
    assert type(saved) is torch.Tensor and saved.shape == (8, 4) and saved.abs().sum() > 0


def test_an_image_of_the_output_is_saved(tmp_path: Path) -> None:
    image = pytest.importorskip("PIL.Image")
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        out = torch.rand(1, 3, 4, 4, device="cuda")
        pixels = (out[0].permute(1, 2, 0) * 255).clamp(0, 255).to(torch.uint8).cpu().numpy()
        image.fromarray(pixels).save(tmp_path / "x.png")
    assert sim.ok and (tmp_path / "x.png").stat().st_size > 0
