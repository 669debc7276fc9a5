"""One cause, one finding in run's report: one cpu tensor that reaches many ops is one finding ("reaches N ops"),
and one model a manager offloaded between prompts is one finding naming the model (ComfyUI-like nodes that keep
their model after the manager's ``free_memory`` moved it to the cpu); ``--json`` keeps every problem and says which
problems each cause stands for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.apps import run_json

JOINED = '''import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.to_k = nn.Linear(8, 8)
        self.to_v = nn.Linear(8, 8)

    def forward(self, x, ctx):
        return x + self.to_k(ctx).mean() + self.to_v(ctx).mean()


blocks = nn.ModuleList([Block(), Block(), Block()]).to("cuda")


def step(x, uncond, cond):
    both = torch.cat([uncond, cond])
    for b in blocks:
        x = b(x, both)
    return x


e = torch.randn(1, 8).to("cpu")
print(step(torch.zeros(2, 8, device="cuda"), e, e).shape)
'''

OFFLOADED = '''import torch, torch.nn as nn


class Clip(nn.Module):
    def __init__(self):
        super().__init__(); self.tok = nn.Embedding(100, 16); self.enc = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    def forward(self, ids): return self.enc(self.tok(ids))


class Patcher:
    def __init__(self, model): self.model = model
    def load(self): self.model.to("cuda")
    def unload(self): self.model.to("cpu")


clip = Patcher(Clip().eval()); clip.load()
for text in ["a cat", "a dog"]:
    ids = torch.tensor([[ord(c) % 100 for c in text]], device="cuda")
    with torch.no_grad():
        print(clip.model(ids).shape)
    clip.unload()
'''


def _text(app: Path) -> str:
    p = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", "--color", "never", app.name],
                       cwd=app.parent, capture_output=True, text=True, timeout=300)
    return p.stdout + p.stderr


def test_one_cpu_tensor_reaching_many_ops_is_one_finding(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(JOINED)
    out = _text(app)
    assert "6 problem(s) recorded (1 cause(s))" in out
    lines = [x for x in out.splitlines() if x.startswith("[device]")]
    assert len(lines) == 1
    assert lines[0].startswith("[device] ctx: ctx (an argument of the Block call, made by ")
    assert "one tensor reaches 6 ops: to_k, to_v in 3 modules (0, 1, 2)" in lines[0]
    doc = run_json(app, "cuda")
    assert len(doc["problems"]) == 6  # every problem is kept
    [cause] = doc["causes"]
    assert sorted(cause["problems"]) == sorted(p["path"] for p in doc["problems"])


def test_a_model_offloaded_between_prompts_is_one_finding_naming_it(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(OFFLOADED)
    out = _text(app)
    lines = [x for x in out.splitlines() if x.startswith("[device]")]
    assert len(lines) == 1, out
    # the whole model is on the cpu, the use read 12 of its 13 tensors: it was left there, not missed by a move
    assert lines[0].startswith("[device] Clip: the Clip model is on cpu (all its 13 tensors; 12 read here) while the "
                               "run is on cuda:0: it was left there"), lines[0]
    doc = run_json(app, "cuda")
    [cause] = doc["causes"]
    assert len(doc["problems"]) > 1 and cause["path"] == "Clip"
    assert "tok.weight" in cause["problems"]
