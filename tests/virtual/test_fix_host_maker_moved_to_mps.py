"""numpy's float64 data made a tensor with ``torch.from_numpy`` and moved to mps (which cannot hold float64): the fix
is a cast at that line, before the move, as a diff proven at the factory, and the program changed so runs clean
(never advice alone). A tensor made on mps in float32 and cast to float64 there later is not fixed at its maker,
which changes nothing: the cast is said."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from support.apps import committed, run_json

APP = """
    import numpy as np, torch, torch.nn as nn
    model = nn.Conv2d(1, 4, 3, padding=1).to("mps")
    data = np.random.rand(1, 1, 8, 8)
    x = torch.from_numpy(data).to("mps")
    print(model(x.float()).shape)
"""

CAST = """
    import torch
    sigmas = torch.linspace(1.0, 0.0, 5, device="mps")
    sig = sigmas.to(torch.float64)
    print(sig[0])
"""



@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_numpy_float64_moved_to_mps_is_cast_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "app.py"
    path.write_text(textwrap.dedent(APP))
    committed(tmp_path)
    [fix] = run_json(path, "mps")["fixes"]
    assert fix["proven"] and "torch.from_numpy" in fix["code"], fix
    assert "+x = torch.from_numpy(data).to(torch.float32).to(\"mps\")" in fix["diff"], fix["diff"]
    (tmp_path / "fix.diff").write_text(fix["diff"])
    subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, check=True, timeout=60)
    assert not run_json(path, "mps")["problems"]


def test_a_cast_on_the_device_is_not_fixed_at_the_maker(tmp_path: Path) -> None:
    path = tmp_path / "app.py"
    path.write_text(textwrap.dedent(CAST))
    [fix] = run_json(path, "mps")["fixes"]  # fixed at the cast's line, never at the maker (line 3)
    assert fix["code"].startswith("# app.py:4: `sig = sigmas.to(torch.float64)` casts to float64 on mps:0"), fix
    assert "+sig = sigmas.to(torch.float32)" in fix["diff"] and "-sigmas = " not in fix["diff"], fix
