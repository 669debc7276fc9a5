"""An optimizer built before ``model.to(device)`` — legal on the real machine, where ``Module.to`` keeps each
``Parameter`` object — trains in a virtual run too: before each step the optimizer is pointed at the parameters the
model now holds (the run's twins), so the loss falls as it does on the CPU. An optimizer state loaded on the CPU
before the move is then met beside its parameter and found, as the real step would raise."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from torch import nn

import torchdoctor

TRAIN = """
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)  # built before the move
    model.to("cuda")
    x = torch.randn(64, 8, device="cuda"); y = x.sum(1, keepdim=True)
    losses = []
    for _ in range(20):
        loss = (model(x) - y).pow(2).mean(); loss.backward(); opt.step(); opt.zero_grad(); losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.5, ("did not train", losses[0], losses[-1])
    print("trained")
"""


def _train(device: str) -> tuple[list[float], nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model.to(device)
    x = torch.randn(64, 8, device=device)
    y = x.sum(1, keepdim=True)
    losses = []
    for _ in range(20):
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, model, opt


def test_an_optimizer_built_before_the_move_trains_as_on_the_cpu() -> None:
    want, _, _ = _train("cpu")
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        got, model, opt = _train("cuda")
    assert sim.problems == [], [p.message for p in sim.problems]
    assert got[-1] < got[0] * 0.5
    assert got == [pytest_approx(v) for v in want]
    held = [p for g in opt.param_groups for p in g["params"]]
    assert [id(p) for p in held] == [id(p) for p in model.parameters()]


def pytest_approx(v: float) -> object:
    import pytest

    return pytest.approx(v, rel=1e-4, abs=1e-6)


def test_under_run_the_program_trains(tmp_path: Path) -> None:
    app = tmp_path / "train.py"
    app.write_text(textwrap.dedent(TRAIN), encoding="utf-8")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda:0", str(app)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "trained" in proc.stdout
    assert "no placement error" in proc.stderr


def test_an_optimizer_state_loaded_on_the_cpu_before_the_move_is_found() -> None:
    m = nn.Linear(8, 2)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(torch.randn(4, 8)).sum().backward()
    opt.step()
    buf = io.BytesIO()
    torch.save({"model": m.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    ck = torch.load(buf)
    with torchdoctor.virtual_devices("xpu", raise_on_exit=False) as sim:
        model = nn.Linear(8, 2)
        model.load_state_dict(ck["model"])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        opt.load_state_dict(ck["opt"])  # the state lands on the parameters' device now: the cpu
        model.to("xpu")
        model(torch.randn(4, 8, device="xpu")).pow(2).mean().backward()
        opt.step()
    paths = [p.path for p in sim.problems if p.kind == "device"]
    assert "optimizer.state[weight].exp_avg" in paths, paths
    assert "optimizer state on cpu while its parameter is on xpu:0" in sim.problems[0].message
