"""A proven fix at a factory's line in the user's own file comes as a unified diff of that file too (issue 41 point
1): ``simulate --json``, the API report and a ``virtual_devices`` report carry the same diff, real ``git apply
--check`` takes it, and the file it leaves runs clean. A factory in an installed package's file gets no diff."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import torchdoctor
from torchdoctor._cli.main import main
from support.apps import committed, load_file as _load

APP = """
    import numpy as np
    import torch
    from torch import nn
    import torchdoctor


    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            mask = torch.ones(4)
            return self.lin(x) * mask


    class FromNumpy(nn.Module):
        def forward(self, x):
            return x + torch.from_numpy(np.ones(4, dtype=np.float32))


    def masked():
        return torchdoctor.Target(Masked(), (torch.ones(2, 4),))


    def from_numpy():
        return torchdoctor.Target(FromNumpy(), (torch.ones(2, 4),))
"""




@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "diffapp.py").write_text(textwrap.dedent(APP), encoding="utf-8")
    committed(tmp_path, "app")
    return tmp_path


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_a_factory_fix_is_one_diff_in_api_cli_and_block_and_git_apply_takes_it(
        repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = repo / "src" / "diffapp.py"
    mod = _load(path, "diffapp_one")
    api = torchdoctor.simulate(mod.masked(), device="cuda:1")
    assert main(["simulate", f"{path}:masked", "--device", "cuda:1", "--json"]) == 1
    cli = json.loads(capsys.readouterr().out)
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        t = mod.masked()
        t.obj.to("cuda:1")(t.args[0].to("cuda:1"))
    diffs = [[d.get("diff") for d in fixes] for fixes in (api.to_dict()["fixes"], cli["fixes"],
                                                          sim.to_dict()["fixes"])]
    assert diffs[0] == diffs[1] == diffs[2] and len(diffs[0]) == 1, diffs
    diff = diffs[0][0]
    assert diff.startswith("--- a/src/diffapp.py\n+++ b/src/diffapp.py\n@@ ")
    assert "-        mask = torch.ones(4)\n+        mask = torch.ones(4, device=x.device)\n" in diff
    assert api.fixes[0].proven and "Patch (git apply):\n    --- a/src/diffapp.py" in api.text()
    (repo / "fix.diff").write_text(diff, encoding="utf-8")
    done = subprocess.run(["git", "apply", "--check", "fix.diff"], cwd=repo, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    subprocess.run(["git", "apply", "fix.diff"], cwd=repo, check=True, timeout=60)
    assert torchdoctor.simulate(_load(path, "diffapp_fixed").masked(), device="cuda:1").ok
    assert "diffapp_one" not in sys.modules


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_from_numpy_is_moved_after_the_call(repo: Path) -> None:
    path = repo / "src" / "diffapp.py"
    report = torchdoctor.simulate(_load(path, "diffapp_np").from_numpy(), device="cuda:1")
    [fix] = report.fixes
    assert fix.proven and fix.diff is not None
    assert "+        return x + torch.from_numpy(np.ones(4, dtype=np.float32)).to(x.device)\n" in fix.diff


def test_a_factory_in_an_installed_package_gets_no_diff() -> None:
    from torchdoctor._virtual.fixes import maker_diff
    from torchdoctor._virtual.origin import LINES

    torch_file = torch.nn.functional.__file__  # an installed package's file: never offered as a patch
    LINES["functional.py:1"] = (torch_file, 1)
    try:
        assert maker_diff("torch.ones", "functional.py:1", torch.device("cuda:1")) is None
    finally:
        del LINES["functional.py:1"]
