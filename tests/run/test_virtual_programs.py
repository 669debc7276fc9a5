"""Whole programs under ``torchdoctor run --device`` (issue 40): what they take back to the CPU is saved and read
back, the device they pick is the one asked for, in a subprocess under a timeout as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

from run.test_run_cli import run, write


SAVES = """
    import sys
    import torch
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    x = torch.randn(2, 3)
    y = (x.to("cuda:0") * 2).to("cpu")
    torch.save(y, "y.pt")
    save_file({"y": y}, "y.safetensors")
    assert torch.equal(torch.load("y.pt"), x * 2) and torch.equal(load_file("y.safetensors")["y"], x * 2)
    print("saved", type(y).__name__, tuple(y.shape), y.dtype)
"""


def test_a_program_saves_what_it_takes_back_and_reads_it_again(tmp_path: Path) -> None:
    script = write(tmp_path / "prog.py", SAVES)
    proc = run("--device", "cuda:1", "--json", str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "saved Tensor (2, 3) torch.float32" in proc.stdout
    doc = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert doc["ok"] and doc["problems"] == [] and doc["exit_code"] == 0
    assert torch_load(tmp_path / "y.pt").shape == (2, 3)


def torch_load(path: Path) -> "object":
    import torch

    return torch.load(path, weights_only=True)


PICKS = """
    import torch
    device = torch.device("cuda", torch.cuda.current_device())  # how ComfyUI picks its device
    model = torch.nn.Linear(4, 4).to(device)
    y = model(torch.ones(2, 4, device="cuda"))
    print("current", torch.cuda.current_device(), "count", torch.cuda.device_count(), "ran on", y.device)
"""


def test_the_apps_own_device_choice_is_the_current_device_as_on_real_hardware(tmp_path: Path) -> None:
    """Device 0 stays current in a virtual run, as on a real two-GPU machine: ComfyUI's pick is cuda:0, and the
    summary says the program picked it."""
    script = write(tmp_path / "app.py", PICKS)
    proc = run("--device", "cuda:1", str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "current 0 count 2 ran on cuda:0" in proc.stdout
    assert "on virtual cuda:1" in proc.stderr and "no placement error" in proc.stderr
    assert "ran on cuda:0 (the program picked it; cuda:1 was asked for)" in proc.stderr


TRAINS = """
    import torch
    from safetensors.torch import save_file

    torch.cuda.set_device(1)  # device 0 stays current otherwise, as on real hardware
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)).to("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(16, 4, device="cuda"), torch.randn(16, 1, device="cuda")
    for step in range(3):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, "model.safetensors")
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, "ckpt.pt")
    print("trained on", next(model.parameters()).device, "loss", round(loss.item(), 4))
"""


def test_a_training_step_and_a_save_finish_under_run(tmp_path: Path) -> None:
    script = write(tmp_path / "train.py", TRAINS)
    proc = run("--device", "cuda:1", str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "trained on cuda:1 loss" in proc.stdout and "no placement error" in proc.stderr
    import torch
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "model.safetensors"))
    assert weights["0.weight"].shape == (8, 4) and weights["0.weight"].abs().sum() > 0
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["model"]["2.bias"].device.type == "cpu" and ckpt["optimizer"]["state"][0]["exp_avg"].shape == (8, 4)
