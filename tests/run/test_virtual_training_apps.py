"""The three training loops of ``tests/virtual/rt_apps.py`` (a peft LoRA model, an sd-scripts-style network with
``network.to(device)``, a real ``transformers.Trainer``) finish with 0 problems as a user runs them: a program
under ``torchdoctor run --device cuda:1`` and tests under ``@pytest.mark.simulate("cuda:1")``, each in a
subprocess under a timeout (issue 40, point 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from run.test_run_cli import run, write

pytest_plugins = ["pytester"]

REPO = str(Path(__file__).resolve().parents[2])

PROGRAM = f"""
    import sys
    sys.path.insert(0, {REPO!r})
    import torch
    from tests.virtual import rt_apps

    torch.cuda.set_device(1)  # device 0 stays current otherwise, as on real hardware

    lora_b = rt_apps.lora_llama_steps()
    network = rt_apps.sd_network_steps()
    result, model = rt_apps.trainer_steps()
    print("lora", lora_b.weight.device, lora_b.weight.abs().sum().item() > 0)
    print("network", network.loras[0].lora_up.weight.device, network.loras[0].lora_up.weight.abs().sum().item() > 0)
    print("trainer", result.global_step, next(model.parameters()).device)
"""


def test_the_three_loops_finish_under_run(tmp_path: Path) -> None:
    script = write(tmp_path / "train.py", PROGRAM)
    proc = run("--device", "cuda:1", "--json", str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "lora cuda:1 True" in proc.stdout and "network cuda:1 True" in proc.stdout
    assert "trainer 3 cuda:0" in proc.stdout  # Trainer picks cuda:0 itself, with DataParallel over both GPUs
    doc = json.loads(proc.stdout[proc.stdout.rindex("\n{\n"):])  # after Trainer's own printed summary
    assert doc["ok"] and doc["problems"] == [] and doc["exit_code"] == 0
    assert "bitsandbytes" not in proc.stderr


MARKED = f"""
import sys
sys.path.insert(0, {REPO!r})
import pytest, torch
from tests.virtual import rt_apps

pytestmark = pytest.mark.simulate("cuda:1")

def test_lora():
    lora_b = rt_apps.lora_llama_steps()
    assert lora_b.weight.is_cuda and lora_b.weight.abs().sum().item() > 0

def test_network():
    network = rt_apps.sd_network_steps()
    assert network.loras[0].lora_up.weight.is_cuda

def test_trainer():
    result, model = rt_apps.trainer_steps()
    assert result.global_step == 3

def test_network_left_behind():
    rt_apps.sd_network_steps(steps=1, move_network=False)
"""


def test_the_three_loops_pass_under_the_marker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_marked_training=MARKED)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-W", "ignore",
                                           timeout=600)
    out = result.stdout.str()
    result.assert_outcomes(passed=3, failed=1)
    assert "test_network_left_behind" in out and "lora_down.weight" in out, out
