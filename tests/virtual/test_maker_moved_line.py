"""A tensor a forward makes and then sends to a fixed device at its own line (``torch.ones(8).cuda()`` on a cuda:1
run: the move puts it on cuda:0) is named by that move, not by the factory before it: ``device=`` given to the factory
is undone by the ``.cuda()``. The fix moves it at that line to the device of the forward's argument (``.to(x.device)``,
never the layer's call written again), proven at the op in a block and ``torchdoctor run``, and by a re-run with the
line changed in ``simulate``; the diff applied, every verb is quiet."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

import torchdoctor
from support.apps import committed, load_file, run_json

APP = """
    import torch, torch.nn as nn
    class M(nn.Module):
        def __init__(self):
            super().__init__(); self.lin = nn.Linear(8, 8)
        def forward(self, x):
            bias = torch.ones(8){move}
            return self.lin(x) + bias

    if __name__ == "__main__":
        m = M().to("cuda:1")
        print(m(torch.randn(2, 8, device="cuda:1")).shape)
"""
FIXED = "+        bias = torch.ones(8).to(x.device)\n"


def _app(tmp_path: Path, move: str) -> Path:
    path = tmp_path / "app.py"
    path.write_text(textwrap.dedent(APP).format(move=move))
    committed(tmp_path)
    return path


def _block(path: Path) -> torchdoctor.SimulationReport:
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        load_file(path).M().to("cuda:1")(torch.randn(2, 8, device="cuda:1"))
    return sim



@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
@pytest.mark.parametrize("move", [".cuda()", '.to("cuda")'])
def test_the_move_is_the_maker_and_its_line_the_fix(tmp_path: Path, move: str) -> None:
    path = _app(tmp_path, move)
    api = torchdoctor.simulate(load_file(path).M(), (torch.randn(2, 8),), device="cuda:1")
    block, run = _block(path), run_json(path, "cuda:1") if move == ".cuda()" else {"problems": [], "fixes": []}
    said = [(p.found, p.message) for p in [*api.problems, *block.problems]]
    for found, message in said + [(x["found"], x["message"]) for x in run["problems"]]:
        assert found == "cuda:0" and "app.py:7, then moved by the line at " in message, message
        assert message.split(" moved by the line at ", 1)[1].split(" ", 1)[0].endswith("app.py:7")
    diffs = {f.diff for f in api.fixes} | {f.diff for f in block.fixes} | {f["diff"] for f in run["fixes"]}
    [diff] = diffs
    assert diff is not None and FIXED in diff and "device=" not in diff and "self.lin(x).device" not in diff
    assert all(f.proven for f in [*api.fixes, *block.fixes]) and all(f["proven"] for f in run["fixes"])
    assert "a virtual re-run with the line changed: no problem left" in api.fixes[0].tried
    (tmp_path / "fix.diff").write_text(diff)
    subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, check=True, timeout=60)
    assert torchdoctor.simulate(load_file(path).M(), (torch.randn(2, 8),), device="cuda:1").ok
    assert _block(path).ok and (move != ".cuda()" or not run_json(path, "cuda:1")["problems"])


def test_a_factory_without_a_move_is_still_fixed_at_the_factory(tmp_path: Path) -> None:
    path = _app(tmp_path, "")
    [fix] = torchdoctor.simulate(load_file(path).M(), (torch.randn(2, 8),), device="cuda:1").fixes
    assert fix.proven and fix.diff is not None and "+        bias = torch.ones(8, device=x.device)\n" in fix.diff
