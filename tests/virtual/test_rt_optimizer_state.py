"""An optimizer state loaded on the CPU before the model's move (resuming from a checkpoint) is one finding for the
optimizer — not one per state tensor plus one per update op that met them — with the fix named as the program holds
the optimizer and the model. Both fixes it offers run clean."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from torch import nn

import torchdoctor
from torchdoctor._virtual.training import state_fix


def _resume(order: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    src = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(2, 4)).sum().backward()
    src.step()
    src.zero_grad()
    buf = io.BytesIO()
    torch.save(src.state_dict(), buf)
    buf.seek(0)
    if order == "load, then move":
        opt.load_state_dict(torch.load(buf))
        model.to("cuda")
    elif order == "move, then load":
        model.to("cuda")
        opt.load_state_dict(torch.load(buf))
    else:
        opt.load_state_dict(torch.load(buf))
        torchdoctor.move(model, "cuda:0", optimizer=opt)
    for _ in range(2):
        loss = model(torch.randn(8, 4, device="cuda")).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


def test_a_state_loaded_before_the_move_is_one_finding_with_its_fix() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        _resume("load, then move")
    assert len(sim.problems) == 1, [p.message for p in sim.problems]  # was 11: 8 state tensors, 3 update ops
    p = sim.problems[0]
    assert (p.kind, p.path, p.found, p.expected, p.role, p.op) == (
        "device", "optimizer.state[0.weight].exp_avg", "cpu", "cuda:0", "optimizer", "Optimizer.step")
    assert "and 7 more (exp_avg, exp_avg_sq of 4 parameter(s))" in p.message
    assert "optimizer state on cpu while its parameter is on cuda:0 (Adam opt)" in p.message
    fix = state_fix(p)
    assert fix is not None
    # the program's own lines, swapped (``tests/run/test_run_s28.py`` applies the patch)
    assert fix.startswith("# opt.load_state_dict(torch.load(buf)) ran before model.to('cuda')"), fix
    assert "model.to('cuda')\nopt.load_state_dict(torch.load(buf))  # after the move" in fix
    assert "torchdoctor.move(model, 'cuda:0', optimizer=opt)" in p.message  # the other way, said


def test_the_fix_names_the_model_the_optimizer_trains() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        other = nn.Linear(4, 4).to("cuda")  # another model that runs first
        other(torch.randn(2, 4, device="cuda"))
        model2 = nn.Linear(4, 1)
        opt2 = torch.optim.Adam(model2.parameters())
        model2(torch.randn(2, 4)).sum().backward()
        opt2.step()
        model2.to("cuda")
        model2(torch.randn(2, 4, device="cuda")).sum().backward()
        opt2.step()
    [p] = sim.problems  # the cpu warm-up's loss is model2's own, on the cpu: no "<loss>" finding
    fix = state_fix(p) or ""
    # (a step on the cpu made the state before the move: reloaded after it, session 31)
    assert "made the state on cpu before model2.to('cuda')" in fix, fix
    assert "model2.to('cuda')\nopt2.load_state_dict(opt2.state_dict())  # after the move" in fix, fix
    assert other is not None


def test_both_fixes_run_clean() -> None:
    for order in ("move, then load", "torchdoctor.move"):
        with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
            _resume(order)
        assert sim.problems == [], (order, [p.message for p in sim.problems])


def test_run_reports_one_problem(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent("""
        import io, torch, torch.nn as nn
        model = nn.Linear(4, 2)
        opt = torch.optim.AdamW(model.parameters())
        model(torch.randn(2, 4)).sum().backward(); opt.step(); opt.zero_grad()
        buf = io.BytesIO(); torch.save(opt.state_dict(), buf); buf.seek(0)
        opt.load_state_dict(torch.load(buf))
        model.cuda()
        model(torch.randn(3, 4).cuda()).sum().backward(); opt.step()
    """))
    out = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", str(app)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    text = out.stdout + out.stderr
    assert "1 problem(s) recorded" in text, text
    assert "(AdamW opt)" in text
