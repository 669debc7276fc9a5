"""The progress line of long work (issue 42 point 9): on stderr, on a terminal or when ``TORCHDOCTOR_PROGRESS=1``
asks for it (a CI log), never with ``--json`` (a program reads that output) nor ``-q``. ``simulate`` draws it as a
bar over the model's leaf modules: a forward that takes long shows how far it got."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchdoctor._report.progress import wanted

APP = """
import time, torch, torchdoctor
from torch import nn

class Slow(nn.Module):
    def forward(self, x):
        time.sleep(2.5)  # the long part of the forward: the bar shows how far the forward got
        return x

def target():
    return torchdoctor.Target(nn.Sequential(nn.Linear(4, 4), Slow(), nn.Linear(4, 4)), (torch.ones(1, 4),))
"""


def test_wanted_on_a_terminal_or_when_asked_never_when_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("TORCHDOCTOR_PROGRESS", raising=False)
    assert wanted(stream=Terminal()) and not wanted(stream=io.StringIO())
    assert not wanted(True, Terminal())
    monkeypatch.setenv("TORCHDOCTOR_PROGRESS", "1")
    assert wanted(stream=io.StringIO()) and not wanted(True, io.StringIO())


def test_simulate_draws_a_bar_over_modules_when_asked_and_none_with_json_or_q(tmp_path: Path) -> None:
    (tmp_path / "slowapp.py").write_text(APP)
    env = {**os.environ, "TORCHDOCTOR_PROGRESS": "1", "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "COLUMNS": "200"}
    runs = {extra: subprocess.Popen([sys.executable, "-m", "torchdoctor", "simulate", "slowapp.py:target",
                                     "--device", "cuda:1", *extra.split()], cwd=tmp_path, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # bytes: a text pipe reads \r as \n
            for extra in ("", "--json", "-q")}
    out = {extra: (*(b.decode() for b in p.communicate(timeout=300)), p.returncode) for extra, p in runs.items()}
    stdout, stderr, code = out[""]
    assert code == 0 and stdout.startswith("ok: no placement problems"), stdout + stderr
    assert "simulating slowapp.py:target on virtual cuda:1 (NVIDIA H100 (virtual)), modules 1/3 [###.......] (" \
        in stderr, stderr
    assert stderr.endswith("\r")  # the line is erased before the command ends
    stdout, stderr, code = out["--json"]
    assert code == 0 and json.loads(stdout)["ok"] is True and "simulating" not in stderr, stderr
    stdout, stderr, code = out["-q"]
    assert code == 0 and "simulating" not in stderr and stdout.startswith("ok: no placement problems"), stderr
