"""fp16 mixed precision over weights the program cast to bfloat16 (pytorch #127176, hunt A4): the GradScaler is
accelerate's (``Accelerator(mixed_precision="fp16")``) and the program calls no ``scaler.*`` itself, so the fix is
accelerate's setting at its line (a diff), with the cast that made the weights bfloat16 named; ``simulate(call=)``
and the marker prove it by a re-run with no GradScaler; the patched program runs clean. The program's own
``GradScaler()`` is named at its line instead, and an ``Accelerator()`` whose fp16 comes from accelerate's config
gets the argument written in."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from torch import nn

import torchdoctor
from support.apps import load_file

pytest_plugins = ["pytester"]

TRAIN = """\
    import torch, torch.nn as nn, torch.nn.functional as F
    from accelerate import Accelerator

    def train(model):
        accelerator = Accelerator({arg})
        model.to(torch.bfloat16)  # full bf16
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, opt = accelerator.prepare(model, opt)
        x = torch.randn(8, 16, device=accelerator.device)
        y = torch.randint(0, 4, (8,), device=accelerator.device)
        with accelerator.autocast():
            loss = F.cross_entropy(model(x), y)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    if __name__ == "__main__":
        train(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)))
"""
NAMED = "the GradScaler is accelerate's: `Accelerator("
NEW = '+    accelerator = Accelerator(mixed_precision="bf16")\n'


def _run(cwd: Path, env: dict[str, str] | None = None) -> str:
    r = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", "app.py"], cwd=cwd,
                       capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    return r.stdout + r.stderr


def _patch(out: str) -> str:
    patch = out.split("Patch (git apply):\n", 1)[1]
    return "\n".join(line[4:] for line in patch.splitlines() if line.startswith("    ")) + "\n"


@pytest.mark.parametrize("arg, env", [('mixed_precision="fp16"', {}),
                                      ("", {"ACCELERATE_MIXED_PRECISION": "fp16"})], ids=["argument", "config"])
def test_run_fixes_accelerates_setting_where_the_program_asks_for_it(tmp_path: Path, arg: str,
                                                                     env: dict[str, str]) -> None:
    (tmp_path / "app.py").write_text(textwrap.dedent(TRAIN.format(arg=arg)))
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    out = _run(tmp_path, env)
    fix = out.split("Fix:", 1)[1]
    assert f"{NAMED}{arg})` at app.py:5 asks for " in fix, out
    assert "bfloat16 weights made by `model.to(torch.bfloat16)` at app.py:6" in fix, out
    assert "or drop the cast at app.py:6" in fix and "scaler.scale(loss)" not in fix, out
    assert "torchdoctor run runs a program once" in fix, out  # unproven in run, said why
    (tmp_path / "p.diff").write_text(_patch(out))
    assert NEW in (tmp_path / "p.diff").read_text()
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True, timeout=60)
    assert "no placement error" in _run(tmp_path, env)


def test_simulate_call_proves_the_setting_by_a_rerun(tmp_path: Path) -> None:
    from accelerate.state import AcceleratorState

    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(TRAIN.format(arg='mixed_precision="fp16"')))
    mod = load_file(path)
    AcceleratorState._reset_state(True)  # another test of this process may have left its state initialized
    try:
        r = torchdoctor.simulate(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)), device="cuda",
                                 call=mod.train)
    finally:
        AcceleratorState._reset_state(True)
    [fix] = r.fixes
    assert fix.code.startswith("# " + NAMED) and fix.proven, (fix.code, fix.tried)
    assert fix.tried == "applied in a virtual re-run: no problem left"
    assert fix.diff is not None and NEW in fix.diff


OWN = """\
    import torch, torch.nn as nn

    model = nn.Linear(8, 2).to("cuda")
    model.bfloat16()
    scaler = torch.amp.GradScaler("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(torch.randn(4, 8, device="cuda", dtype=torch.bfloat16)).float().sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
"""


def test_the_programs_own_scaler_is_named_at_its_line(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(textwrap.dedent(OWN))
    fix = _run(tmp_path).split("Fix:", 1)[1]
    assert "# the program's GradScaler (`torch.amp.GradScaler(\"cuda\")` at app.py:5) unscales the bfloat16 " \
           "weights made by `model.bfloat16()` at app.py:4" in fix, fix
    assert "Accelerator" not in fix and "or drop the cast at app.py:4" in fix, fix


MARKED = '''
import pytest, torch, torch.nn as nn
from accelerate import Accelerator
from accelerate.state import AcceleratorState

@pytest.mark.simulate(device="cuda")
def test_train():
    try:
        accelerator = Accelerator(mixed_precision="fp16")
        model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).to(torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, opt = accelerator.prepare(model, opt)
        with accelerator.autocast():
            loss = model(torch.randn(8, 16, device=accelerator.device)).float().pow(2).mean()
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    finally:
        AcceleratorState._reset_state(True)
'''


def test_the_marker_proves_it_by_rerunning_the_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_acc=MARKED)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", timeout=600)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert NAMED + 'mixed_precision="fp16")` at test_acc.py:8' in out, out[-3000:]
    assert "# fix proven (applied in a virtual re-run of the test: no problem left)" in out, out[-3000:]
    assert '+        accelerator = Accelerator(mixed_precision="bf16")' in out, out[-3000:]

