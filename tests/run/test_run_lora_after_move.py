"""LoRA layers injected after ``model.to(device, dtype=torch.bfloat16)`` (ViperEkura/AstrAI PR #19/#20, hunt B9): the
adapters are built on the cpu in float32. ``run`` fixes both at the line that builds them, as ``simulate`` does --
``LoRALinear(child).to(child.weight.device, child.weight.dtype)`` -- with no second, generic "cast them where they are
made" note for the same tensors; the patched program runs clean virtually and on this CPU (where the dtype error is
real)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LORA = '''import torch, torch.nn as nn

class LoRALinear(nn.Module):
    def __init__(self, base, r=4):
        super().__init__()
        self.base = base
        self.lora_A = nn.Parameter(torch.randn(r, base.in_features) * 0.01)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r))
    def forward(self, x):
        return self.base(x) + x @ self.lora_A.T @ self.lora_B.T

def inject(model):
    for name, mod in list(model.named_modules()):
        child = getattr(mod, "q", None)
        if isinstance(child, nn.Linear):
            mod.q = LoRALinear(child)
'''
APP = '''import torch, torch.nn as nn
from lora import inject

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.o = nn.Linear(16, 16), nn.Linear(16, 16)
    def forward(self, x):
        return self.o(self.q(x).relu())

device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Sequential(Block(), Block()).to(device, dtype=torch.bfloat16)
inject(model)
opt = torch.optim.AdamW([p for n, p in model.named_parameters() if "lora_" in n], lr=1e-3)
model(torch.randn(2, 16, device=device, dtype=torch.bfloat16)).float().sum().backward()
opt.step()
print("trained")
'''


def _run(cwd: Path) -> str:
    r = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", "app.py"], cwd=cwd,
                       capture_output=True, text=True, timeout=300)
    return r.stdout + r.stderr


def test_lora_built_after_a_move_and_cast_is_fixed_in_both_at_its_line(tmp_path: Path) -> None:
    (tmp_path / "lora.py").write_text(LORA)
    (tmp_path / "app.py").write_text(APP)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    out = _run(tmp_path)
    fix = out.split("Fix:", 1)[1]
    assert "# 2 LoRALinear modules are built at lora.py:16 after the model was moved and cast to bfloat16, on the " \
           "cpu: move them where they are built (LoRALinear(child).to(child.weight.device, child.weight.dtype))" in fix, out
    assert "no line that made them was recorded" not in fix, out
    patch = fix.split("Patch (git apply):\n", 1)[1]
    diff = "\n".join(line[4:] for line in patch.splitlines() if line.startswith("    ")) + "\n"
    (tmp_path / "p.diff").write_text(diff)
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True, timeout=60)
    assert "no placement error" in _run(tmp_path)
    plain = subprocess.run([sys.executable, "app.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0 and "trained" in plain.stdout, plain.stderr[-2000:]
