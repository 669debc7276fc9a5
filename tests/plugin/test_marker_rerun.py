"""The ``@pytest.mark.simulate`` marker gives a fix the verdict ``simulate(model, call=app)`` gives it (hunt N2/N4/U12);
``torchdoctor run`` and ``virtual_devices`` run the code once and say that only a re-run proves such a fix.

A cast several ops upstream of the failing op (``h = self.a(x).float()``, then ``h * 2 + 1``, then the layer) cannot be
judged at the op -- an op in between may undo it -- so a block of the user's code used to leave it "unproven: only a
re-run of the whole program proves it" while the API proved it by re-running ``app``. The marker owns its test
function and re-runs it on virtual devices with the line fixed: proven there when the API proves it (with the same
diff), unproven when the re-run still finds the failure (a module-level float32 constant promotes again after it).
One pytest run in a subprocess serves both tests; the API runs here on the same code.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import torchdoctor

SUITE = '''
import pytest, torch
from torch import nn

K = torch.full((8,), 0.5)  # float32, read by Promoted's forward after the cast


class Far(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h = self.a(x).float()  # FAR-CAST
        h = torch.relu(h * 2 + 1)
        return self.lin(h)


class Promoted(Far):
    def forward(self, x):
        h = self.a(x).float()  # PROMOTED-CAST
        h = torch.relu(h * 2 + 1) * K.to(x.device)
        return self.lin(h)


def app(m):
    m = m.to("cuda:0", torch.bfloat16)
    return m(torch.randn(2, 8, device="cuda:0", dtype=torch.bfloat16))


@pytest.mark.simulate(device="cuda:0", dtype="bfloat16")
def test_far():
    app(Far())


@pytest.mark.simulate(device="cuda:0", dtype="bfloat16")
def test_promoted():
    app(Promoted())
'''


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("rerun")
    (folder / "test_suite.py").write_text(SUITE, encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", "-q",
                           "test_suite.py"], cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    return folder, proc.stdout


def _section(out: str, name: str) -> str:
    start = out.index(f"_ {name} _")
    end = out.find("\n____", start + 1)
    return out[start:end if end != -1 else len(out)]


def _load(folder: Path) -> Any:
    spec = importlib.util.spec_from_file_location("_h4_rerun_suite", folder / "test_suite.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _api(folder: Path, cls: str) -> Any:
    mod = _load(folder)
    return torchdoctor.simulate(getattr(mod, cls)(), device="cuda:0", dtype=torch.bfloat16, call=mod.app)


def _line(folder: Path, mark: str) -> int:
    return next(i for i, x in enumerate((folder / "test_suite.py").read_text().splitlines(), 1) if mark in x)


def test_a_far_cast_fix_is_proven_by_rerunning_the_test_as_the_api_proves_it(shared: tuple[Path, str]) -> None:
    folder, out = shared
    text = _section(out, "test_far")
    line = _line(folder, "FAR-CAST")
    assert f"# test_suite.py:{line}: `h = self.a(x).float()" in text
    assert "casts to float32 where aten.addmm.default computes in bfloat16" in text
    assert "# fix proven (applied in a virtual re-run of the test: no problem left)" in text
    assert "only a re-run of the whole program proves it" not in text
    assert "+        h = self.a(x).to(torch.bfloat16)  # FAR-CAST" in text and "Patch (git apply):" in text
    (fix,) = _api(folder, "Far").to_dict()["fixes"]  # the API: the same fix, proven, the same diff
    assert fix["proven"] and f"test_suite.py:{line}" in fix["code"]
    assert "+        h = self.a(x).to(torch.bfloat16)  # FAR-CAST" in fix["diff"]
    # virtual_devices around a block cannot run the block twice: it says so, never "proven"
    mod = _load(folder)
    with torchdoctor.virtual_devices("cuda:0", torch.bfloat16, raise_on_exit=False) as block:
        mod.app(mod.Far())
    (part,) = block.fixes
    assert not part.proven and "only a re-run of the whole program proves it" in part.tried


def test_a_far_cast_fix_the_rerun_still_fails_stays_unproven_in_both(shared: tuple[Path, str]) -> None:
    folder, out = shared
    text = _section(out, "test_promoted")
    assert "# fix unproven: applied in a virtual re-run of the test, which still found: a tensor made by aten.mul" in text
    assert "# fix proven" not in text and "Patch (git apply):" not in text
    # the API re-runs again with what its re-run found (the line that promotes the cast's data with the float32 K):
    # the cast's fix alone is never proven; with that line's value cast back both are, together, in one patch
    fixes = _api(folder, "Promoted").to_dict()["fixes"]
    assert len(fixes) == 2 and all(f["proven"] for f in fixes), fixes
    assert "PROMOTED-CAST" in fixes[0]["code"], fixes
    assert "h = (torch.relu(h * 2 + 1) * K.to(x.device)).to(x.dtype)" in fixes[1]["code"], fixes
    # the float32 tensor that promotes there is K, made before the run: never "a tensor the cast ... made float32"
    assert "with K (float32, made before the run)" in fixes[1]["code"], fixes
    assert "the cast at" not in fixes[1]["code"], fixes


PROGRAM = '''
import torch
from test_suite import Far, app

app(Far())
'''


def test_run_keeps_the_far_fix_unproven_and_says_why_it_does_not_rerun_the_program(shared: tuple[Path, str]) -> None:
    from run.test_run_cli import run

    folder, _ = shared
    (folder / "prog.py").write_text(PROGRAM, encoding="utf-8")
    proc = run("--device", "cuda:0", "--dtype", "bfloat16", "--json", "prog.py", cwd=folder)
    assert proc.returncode == 1, proc.stderr[-2000:]
    doc = json.loads(proc.stdout[proc.stdout.index('{\n  "schema"'):])
    (fix,) = doc["fixes"]  # a program is run once: its files and output are not written twice to prove a fix
    assert not fix["proven"] and "only a re-run of the whole program proves it" in fix["tried"]
    assert "torchdoctor run runs a program once (a second run would write its files and output again): " \
        "simulate(model, call=...) or @pytest.mark.simulate re-run it" in fix["tried"]
