"""A model accelerate's ``dispatch_model`` spreads over cuda:0 and cuda:1, whose forward adds a tensor computed once
by a layer on cuda:0 to the stream the layers hand on (YOLOS' mid position embeddings, before transformers fixed that
line): the fix is that operand moved to the stream's device at the program's line (``_virtual/streamfix``), a diff
proven at the failing op — never a layer moved by hand, never advice alone. Applied, a virtual re-run is clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

PROGRAM = """
    import torch
    from torch import nn
    from accelerate import dispatch_model


    class Mid(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Parameter(torch.randn(2, 1, 5, 8))

        def forward(self, n):
            return self.table * n


    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.mid = Mid()
            self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
            self.head = nn.Linear(8, 2)

        def forward(self, h):
            mid = self.mid(1.0)
            for i, layer in enumerate(self.layers):
                h = layer(h)
                if i < 2:
                    h = STREAM
            return self.head(h)


    model = dispatch_model(Encoder().eval(), device_map={"mid": 0, "layers.0": 0, "layers.1": 1, "layers.2": 1,
                                                         "head": 1})
    with torch.no_grad():
        out = model(torch.randn(1, 5, 8, device="cuda:0" if torch.cuda.is_available() else "cpu"))
    print("out", tuple(out.shape))
"""


def _run(root: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", "--count", "2", "--json",
                           "main.py"], cwd=root, env=ENV, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    out = proc.stdout
    return json.loads(out[out.index('{\n  "schema"'):])


def _check(root: Path, stream: str, fixed: str) -> None:
    (root / "main.py").write_text(textwrap.dedent(PROGRAM).lstrip().replace("STREAM", stream))
    doc = _run(root)
    assert len(doc["fixes"]) == 1, doc["fixes"]
    fix = doc["fixes"][0]
    assert fix["proven"], fix
    assert "mid[i] (on cuda:0) meets h (on cuda:1)" in fix["code"]
    assert "move it to the stream's device at that line (mid[i].to(h.device)), never a layer by hand" in fix["code"]
    assert f"+                {fixed}" in doc["patch"], doc["patch"]
    subprocess.run(["git", "init", "-q", "."], cwd=root, check=True)
    subprocess.run(["git", "apply", "-"], cwd=root, input=doc["patch"], text=True, check=True)
    again = _run(root)
    assert again["ok"] and not again["problems"], again


def test_a_tensor_computed_once_follows_the_stream_at_the_programs_line(tmp_path: Path) -> None:
    _check(tmp_path, "h + mid[i]", "h = h + mid[i].to(h.device)")


def test_the_same_through_torch_add(tmp_path: Path) -> None:
    _check(tmp_path, "torch.add(h, mid[i])", "h = torch.add(h, mid[i].to(h.device))")
