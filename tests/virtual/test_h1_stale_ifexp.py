"""A name bound to the caller's tensor through a conditional before the method moves it (TransformerLens'
``generate``: ``input_tokens = input if isinstance(input, torch.Tensor) else None`` then ``input = input.to(device)``;
``torch.cat((input_tokens, ...))`` at the end) is the stale name ``stalename`` fixes where it is read, as a plain
``a = b`` is: never the caller's factory (the method is documented to take cpu tokens)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

APP = """
    import torch, torch.nn as nn
    class Gen:
        def __init__(self, device):
            self.emb, self.device = nn.Embedding(16, 16).to(device), device
        @torch.no_grad()
        def generate(self, input, steps=2):
            input_tokens = input if isinstance(input, torch.Tensor) else None
            input = input.to(self.device)
            tokens = input
            for _ in range(steps):
                nxt = self.emb(tokens)[:, -1].argmax(-1, keepdim=True)
                tokens = torch.cat([tokens, nxt], dim=1)
            return torch.cat((input_tokens, tokens[:, input.shape[1]:]), dim=1)
    out = Gen("cuda").generate(torch.tensor([[1, 5, 7]]))
    print("tokens", tuple(out.shape))
"""


def _run(root: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", "--json", "app.py"],
                          cwd=root, env=ENV, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    return proc, json.loads(proc.stdout[proc.stdout.index('{\n  "schema"'):])


def test_a_name_bound_through_a_conditional_before_the_move_is_fixed_where_it_is_read(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(textwrap.dedent(APP).lstrip())
    proc, doc = _run(tmp_path)
    assert proc.returncode == 1 and doc["problems"], proc.stderr[-3000:]
    fix = doc["fixes"][0]
    assert fix["proven"], fix
    assert fix["code"].startswith("# app.py:7 binds input_tokens to input before app.py:8 moves input"), fix["code"]
    assert "device='cuda:0'" not in doc["patch"], doc["patch"]
    assert "+        return torch.cat((input_tokens.to(input.device), tokens[:, input.shape[1]:]), dim=1)" in \
        doc["patch"], doc["patch"]
    subprocess.run(["git", "init", "-q", "."], cwd=tmp_path, check=True)
    subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=doc["patch"], text=True, check=True)
    again, doc2 = _run(tmp_path)
    assert again.returncode == 0 and doc2["problems"] == [], again.stderr[-2000:]
