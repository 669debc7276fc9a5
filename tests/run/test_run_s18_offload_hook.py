"""An inner layer of a sub-model that accelerate's ``cpu_offload_with_hook`` offloads, called outside the hooked
forward (Bark's ``generate`` calling ``semantic.input_embeds_layer`` before ``semantic(...)``, transformers #47169):
the report names the hook and the module to call through, in text and in ``--json``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.apps import run_json

APP = '''import torch, torch.nn as nn
from accelerate import cpu_offload_with_hook


class Semantic(nn.Module):
    def __init__(self):
        super().__init__(); self.input_embeds_layer = nn.Embedding(100, 16); self.lm = nn.Linear(16, 100)
    def forward(self, e): return self.lm(e)


class Bark(nn.Module):
    def __init__(self): super().__init__(); self.semantic = Semantic()
    def offload(self):
        _, self.hook = cpu_offload_with_hook(self.semantic, "cuda:0")
    @torch.no_grad()
    def generate(self, ids):
        return self.semantic(self.semantic.input_embeds_layer(ids))


bark = Bark(); bark.offload()
print(bark.generate(torch.tensor([[1, 2, 3]], device="cuda:0")).shape)
'''


def test_an_inner_layer_called_around_the_offload_hook_names_the_hook(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(APP)
    p = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", "--color", "never", "app.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert "  offloaded: `semantic` is offloaded by accelerate's hook (CpuOffload)" in out, out
    assert "this op ran in `semantic.input_embeds_layer` called outside it; call through `semantic`" in out
    doc = run_json(app, "cuda")
    [hit] = [q for q in doc["problems"] if q["path"] == "semantic.input_embeds_layer.weight"]
    assert hit["hook"].startswith("`semantic` is offloaded by accelerate's hook")
    assert all(q["hook"] is None for q in doc["problems"] if q is not hit)
