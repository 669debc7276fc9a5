"""After transformers' ``from_pretrained``, torch's lru-cached factory set (``torch.utils._device._device_constructors``)
holds transformers' ``torch.linspace`` wrapper, so ``torch.set_default_device(...)`` no longer reaches
``torch.linspace``: it stays on the cpu. Measured on this CPU with the meta device first (the mechanism is real, and
the test process itself is never touched: each check runs in a child). A virtual run must not mend it (torchdoctor
never fills torch's cache itself before the program does), and its fix says why and passes the default device
(``device=torch.get_default_device()``), a patch after which the program runs clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

MAKE = """import transformers
cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                               num_attention_heads=2, num_key_value_heads=2)
transformers.LlamaForCausalLM(cfg).save_pretrained("tiny")
"""
PROBE = """import sys, torch, transformers
if "--load" in sys.argv:
    transformers.LlamaForCausalLM.from_pretrained("tiny")
torch.set_default_device("meta")
print(torch.linspace(0, 1, 4).device, torch.zeros(2).device)
"""
APP = """import torch, transformers
model = transformers.LlamaForCausalLM.from_pretrained("tiny")
torch.set_default_device("cuda")
steps = torch.linspace(0, 1, 8)
print((steps * torch.ones(8)).sum().item())
"""


def _py(cwd: Path, *args: str) -> str:
    r = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    return r.stdout + r.stderr


def _printed(cwd: Path, *args: str) -> str:
    r = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip().splitlines()[-1]


def test_the_default_device_misses_linspace_after_from_pretrained_and_the_fix_says_why(tmp_path: Path) -> None:
    (tmp_path / "make.py").write_text(MAKE)
    _py(tmp_path, "make.py")
    (tmp_path / "probe.py").write_text(PROBE)
    assert _printed(tmp_path, "probe.py") == "meta meta"  # the mechanism, measured
    assert _printed(tmp_path, "probe.py", "--load") == "cpu meta"
    (tmp_path / "app.py").write_text(APP)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    out = _py(tmp_path, "-m", "torchdoctor", "run", "--device", "cuda", "app.py")
    fix = out.split("Fix:", 1)[1]
    assert "# torch.linspace made it on cpu although the program set a default device: torch caches its factory " \
           "set (torch.utils._device._device_constructors) the first time a device context asks, and in this " \
           "process it holds transformers." in fix, out
    assert "pass it (torch.linspace(..., device=torch.get_default_device()))" in fix and "# fix proven" in fix, out
    patch = fix.split("Patch (git apply):\n", 1)[1]
    diff = "\n".join(line[4:] for line in patch.splitlines() if line.startswith("    ")) + "\n"
    assert "+steps = torch.linspace(0, 1, 8, device=torch.get_default_device())\n" in diff, diff
    (tmp_path / "p.diff").write_text(diff)
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True, timeout=60)
    assert "no placement error" in _py(tmp_path, "-m", "torchdoctor", "run", "--device", "cuda", "app.py")
