"""``torchdoctor simulate FILE:fn --device cuda:1`` keeps device 0 current, as ``simulate()`` and ``torchdoctor run`` do
and as a real machine does without ``set_device``: a forward's hard-coded ``.cuda()`` lands on cuda:0 and is found
(one case, one answer, whichever way it is asked)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from torchdoctor._cli.main import main

APP = textwrap.dedent("""
    import torch, torch.nn as nn, torchdoctor
    class M(nn.Module):
        def __init__(self):
            super().__init__(); self.lin = nn.Linear(8, 8)
        def forward(self, x):
            bias = torch.ones(8).cuda()  # cuda:0 on a two-GPU machine that never called set_device
            return self.lin(x) + bias
    def target():
        return torchdoctor.Target(M(), (torch.randn(2, 8),))
""")


def test_a_hard_coded_cuda_call_is_found_on_cuda_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "dist_app.py").write_text(APP)
    assert main(["simulate", f"{tmp_path / 'dist_app.py'}:target", "--device", "cuda:1", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [(p["kind"], p["found"], p["expected"]) for p in doc["problems"]] == [("device", "cuda:0", "cuda:1")]
    assert "dist_app.py:7" in doc["problems"][0]["message"]
