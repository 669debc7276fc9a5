"""A far line fix re-run by the marker is proven only when what the re-run leaves is another printed fix's.

The marker re-runs its test with the line fixes applied (``_run/rerun``); the fixes proven at the failing op are not
applied there, so the problems they address are still found and count as theirs. A problem left that no printed fix
addresses is no other fix's: the line fix is then unproven, saying what was still found, as ``simulate``'s re-run of
every fix together says it -- never "what is left is another fix's" when no other fix was printed.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

import torchdoctor
from torchdoctor._run.rerun import prove_by_rerun

PROGRAM = '''
import torch
from torch import nn


class Far(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.lin = nn.Linear(8, 8)
        self.emb = nn.Embedding(10, 8)

    def forward(self, x):
        h = self.a(x).float()  # FAR-CAST
        h = torch.relu(h * 2 + 1)
        ids = torch.arange(2).unsqueeze(1)  # CPU-IDS
        return self.lin(h) + self.emb(ids).sum(1)


def app(m):
    m = m.to("cuda:0", torch.bfloat16)
    return m(torch.randn(2, 8, device="cuda:0", dtype=torch.bfloat16))
'''


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    path = tmp_path_factory.mktemp("leftover") / "far_app.py"
    path.write_text(PROGRAM, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("far_app", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["far_app"] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("far_app", None)


def _session(program: ModuleType) -> torchdoctor.VirtualSession:
    with torchdoctor.virtual_devices("cuda:0", torch.bfloat16, raise_on_exit=False) as session:
        program.app(program.Far())
    assert {p.kind for p in session.problems} == {"device", "dtype"}
    return session


def _line_fix(session: torchdoctor.VirtualSession) -> object:
    return next(f for f in session.fixes if "FAR-CAST" in f.code)


def test_what_is_left_is_the_printed_factory_fix_so_the_far_cast_is_proven(program: ModuleType) -> None:
    session = _session(program)
    assert prove_by_rerun(session, lambda _copy: program.app(program.Far()))
    fix = _line_fix(session)
    assert fix.proven and fix.rerun
    assert "what is left is another fix's" in fix.tried
    assert any("torch.arange" in f.code and f.proven for f in session.fixes)


def test_a_problem_left_that_no_printed_fix_addresses_keeps_the_far_cast_unproven(program: ModuleType) -> None:
    session = _session(program)
    session.fixes = tuple(f for f in session.fixes if "torch.arange" not in f.code)  # the factory's fix not printed
    assert prove_by_rerun(session, lambda _copy: program.app(program.Far()))
    fix = _line_fix(session)
    assert fix.rerun and not fix.proven
    assert "which still found: a tensor made by torch.arange" in fix.tried
    assert "another fix's" not in fix.tried
