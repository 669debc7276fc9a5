"""What ``torchdoctor run`` and an empty ``virtual_devices`` block import before anything goes wrong (issue 43,
point 4): the explain, report-rendering and culprit machinery comes in only when an error does, and no library the
program did not import. From a checkout every module imported is also compiled (no bytecode is written here), so
each one is start time. Each probe is a fresh process under a timeout: this test process has imported everything.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from run.test_run_cli import ENV, TIMEOUT, write

# never imported by a block that runs nothing, nor by `run` before the program fails
LATER = ("torchdoctor._explain", "torchdoctor._move", "torchdoctor._checkpoint", "torchdoctor._distributed",
         "torchdoctor._report.terminal", "torchdoctor._report.diff", "torchdoctor._report.order",
         "torchdoctor._report.layout", "torchdoctor._report.folded", "torchdoctor._guard.diagnose",
         "torchdoctor._scan.policy", "torchdoctor._scan.tally", "rich", "bitsandbytes", "transformers", "diffusers",
         "accelerate", "peft",
         # the page code (a report class is defined at start, its page drawn when asked) and run's error-only parts:
         # what the failing line held, the program's names a fix is written with, the marker's re-run
         "torchdoctor._report.html", "torchdoctor._report.html_assets", "torchdoctor._run.evidence",
         "torchdoctor._run.names", "torchdoctor._run.rerun")

BLOCK = """
    import json, sys
    import torch
    before = set(sys.modules)
    import torchdoctor
    with torchdoctor.virtual_devices("cuda:1"):
        pass
    print(json.dumps(sorted(set(sys.modules) - before)))
"""

APP = """
    import json, sys
    print("MODULES" + json.dumps(sorted(sys.modules)))
"""

# a trivial program that works: a model built, moved and cast (the trace's patches see it), one forward
MODEL_APP = """
    import json, sys
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model = model.to("cuda" if torch.cuda.is_available() else "cpu", torch.float32)
    y = model(torch.ones(3, 4, device=next(model.parameters()).device))
    print("MODULES" + json.dumps(sorted(sys.modules)))
"""

# what explains, blames or fixes an error: never loaded by a program that has none
CULPRIT = ("torchdoctor._guard.diagnose", "torchdoctor._guard.provenance", "torchdoctor._guard.remedy",
           "torchdoctor._guard.maker", "torchdoctor._guard.offer", "torchdoctor._guard.notes",
           "torchdoctor._guard.proof")


def _imported(new: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in new if any(m == p or m.startswith(p + ".") for p in prefixes)]


@pytest.fixture(scope="module")
def block_modules(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    script = write(tmp_path_factory.mktemp("block") / "block.py", BLOCK)
    proc = subprocess.run([sys.executable, str(script)], env=ENV, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    modules: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "torchdoctor._virtual.session" in modules  # the probe saw the block's own import
    return modules


def test_an_empty_virtual_block_imports_no_explain_report_or_library(block_modules: list[str]) -> None:
    assert _imported(block_modules, LATER + ("torchdoctor._cli", "torchdoctor._trace")) == []


def test_an_empty_virtual_block_imports_no_culprit_machinery(block_modules: list[str]) -> None:
    assert _imported(block_modules, ("torchdoctor._guard",)) == []


def _run_modules(tmp_path: Path, *args: str, app: str = APP) -> list[str]:
    script = write(tmp_path / "app.py", app)
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "run", *args, str(script)], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert "no placement error" in proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("MODULES"))
    modules: list[str] = json.loads(line[len("MODULES"):])
    assert "torchdoctor._run.program" in modules
    return modules


# `run` imports the CLI's colour settings at its start (_cli/main.py: torch-free, rich only when colouring)
RUN_LATER = tuple(m for m in LATER if m != "torchdoctor._report.terminal")


def test_run_imports_no_explain_and_no_virtual_devices_before_an_error(tmp_path: Path) -> None:
    modules = _run_modules(tmp_path)
    assert _imported(modules, RUN_LATER + ("torchdoctor._virtual", "torchdoctor._scan", "torchdoctor._env")) == []


def test_run_on_a_virtual_device_imports_no_explain_before_an_error(tmp_path: Path) -> None:
    modules = _run_modules(tmp_path, "--device", "cuda:1")
    assert "torchdoctor._virtual.session" in modules
    assert _imported(modules, RUN_LATER) == []


def test_a_clean_run_of_a_program_that_moves_and_runs_a_model_loads_no_error_machinery(tmp_path: Path) -> None:
    modules = _run_modules(tmp_path, app=MODEL_APP)
    assert "torchdoctor._trace.session" in modules  # the trace saw the move: the probe is not vacuous
    assert _imported(modules, RUN_LATER + CULPRIT + ("torchdoctor._virtual", "torchdoctor._scan",
                                                     "torchdoctor._env", "torchdoctor._rules")) == []
