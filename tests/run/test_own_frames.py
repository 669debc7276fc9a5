"""torchdoctor's own source is never the program's line, in any verb, also when torchdoctor is installed editable (a
checkout on ``sys.path``, outside site-packages, as here): a trace's wrapper of ``Module.to`` was named as "the line
that moved the tensor" (``_trace/patches.py:93``) for a sub-model accelerate's hook offloaded (hunt Y26). A layer
called outside its hooked sub-model at a script's top level gets its own hook at the program's hook line, proven, and
the patched script runs clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import torchdoctor
from support.apps import committed, run_json
from torchdoctor._guard.ownfile import own_file

APP = '''import torch, torch.nn as nn
from accelerate import cpu_offload_with_hook


class Enc(nn.Module):
    def __init__(self):
        super().__init__(); self.embed = nn.Embedding(50, 8); self.proj = nn.Linear(8, 8)
    def forward(self, x): return self.proj(x)


model = nn.ModuleDict({"enc": Enc(), "head": nn.Linear(8, 4)}).eval()
_, hook = cpu_offload_with_hook(model.enc, "cuda:0")
ids = torch.randint(0, 50, (2, 3), device="cuda:0")
with torch.no_grad():
    h = model.enc.embed(ids)
    print(model.enc(h).shape)
'''


def test_no_file_of_torchdoctor_is_the_programs_own(tmp_path: Path) -> None:
    package = Path(torchdoctor.__file__).parent
    files = sorted(package.rglob("*.py"))
    assert len(files) > 200 and not [f for f in files if own_file(str(f))]
    mine = tmp_path / "app.py"
    mine.write_text("x = 1\n")
    assert own_file(str(mine))


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_a_layer_called_around_a_top_level_hook_gets_its_own_hook(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    app = tmp_path / "app.py"
    app.write_text(APP)
    committed(tmp_path)
    p = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", "--color", "never", "app.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert "torchdoctor/" not in out and "_trace" not in out and "patches.py" not in out, out
    assert ".data =" not in out and "move it back" not in out, out
    doc = run_json(app, "cuda")
    [fix] = doc["fixes"]
    assert fix["code"].startswith("cpu_offload_with_hook(model.enc.embed, 'cuda:0')  # before app.py:12: `enc` is "
                                  "offloaded by accelerate's hook (CpuOffload, put at app.py:12)"), fix["code"]
    assert "app.py:15 calls `model.enc.embed` outside it" in fix["code"] and fix["proven"], fix
    (tmp_path / "fix.diff").write_text(doc["patch"])
    done = subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    again = run_json(app, "cuda")
    assert again["ok"] and not again["problems"], again["problems"]
