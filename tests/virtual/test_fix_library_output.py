"""A library module that casts its output by design (diffusers' ``Timesteps``: float32 whatever the model's dtype)
feeding a bf16 layer of the user's own model: the fix is at the program's line that hands that output on —
``self.time_embedding(self.time_proj(t).to(x.dtype))`` — with a diff, never a model-wide cast nor an edit of the
library's line; proven at the failing op (block, ``torchdoctor run``) and by a re-run with that call's output cast
(``simulate``). The patched file is quiet on every verb (hunt W6)."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

import torchdoctor
from support.apps import committed, load_file, run_json

pytest.importorskip("diffusers")

APP = """
    import torch, torch.nn as nn
    from diffusers.models.embeddings import Timesteps, TimestepEmbedding
    class Net(nn.Module):
        def __init__(s):
            super().__init__()
            s.time_proj = Timesteps(32, True, 0)
            s.time_embedding = TimestepEmbedding(32, 64)
            s.out = nn.Linear(64, 8)
        def forward(s, x, t):
            emb = s.time_embedding(s.time_proj(t))
            return s.out(emb) + x

    if __name__ == "__main__":
        net = Net().to("cuda", torch.bfloat16)
        print(net(torch.randn(2, 8, device="cuda", dtype=torch.bfloat16), torch.tensor([10, 20], device="cuda")).dtype)
"""
FIXED = "+        emb = s.time_embedding(s.time_proj(t).to(x.dtype))\n"


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(2, 8), torch.tensor([10, 20])


def _block(path: Path) -> torchdoctor.SimulationReport:
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        net = load_file(path).Net().to("cuda", torch.bfloat16)
        net(torch.randn(2, 8, device="cuda", dtype=torch.bfloat16), torch.tensor([10, 20], device="cuda"))
    return sim



@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_a_library_output_is_cast_at_the_program_line_that_hands_it_on(tmp_path: Path) -> None:
    path = tmp_path / "app.py"
    path.write_text(textwrap.dedent(APP))
    committed(tmp_path)
    api = torchdoctor.simulate(load_file(path).Net(), _inputs(), device="cuda", dtype=torch.bfloat16)
    block, run = _block(path), run_json(path, "cuda")
    fixes = [*api.fixes, *block.fixes]
    assert len(api.fixes) == len(block.fixes) == len(run["fixes"]) == 1
    assert {f.diff for f in fixes} == {run["fixes"][0]["diff"]} and FIXED in run["fixes"][0]["diff"]
    assert all(f.proven for f in fixes) and run["fixes"][0]["proven"]
    assert "a virtual re-run with the line changed: no problem left" in api.fixes[0].tried
    assert all("embeddings.py" not in f.diff.split("\n", 1)[0] and "model.to(" not in f.code for f in fixes)
    (tmp_path / "fix.diff").write_text(run["fixes"][0]["diff"])
    subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, check=True, timeout=60)
    assert torchdoctor.simulate(load_file(path).Net(), _inputs(), device="cuda", dtype=torch.bfloat16).ok
    assert _block(path).ok and not run_json(path, "cuda")["problems"]
