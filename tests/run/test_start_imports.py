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
         "accelerate", "peft")

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


def _run_modules(tmp_path: Path, *args: str) -> list[str]:
    script = write(tmp_path / "app.py", APP)
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "run", *args, str(script)], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert "no placement error" in proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("MODULES"))
    modules: list[str] = json.loads(line[len("MODULES"):])
    assert "torchdoctor._run.program" in modules
    return modules


# `run` still imports these two at its start: the CLI's colour settings (_cli/main.py) and guard's remedy diff
# (_guard/remedy.py, through guard's api)
RUN_LATER = tuple(m for m in LATER if m not in ("torchdoctor._report.terminal", "torchdoctor._report.diff"))


def test_run_imports_no_explain_and_no_virtual_devices_before_an_error(tmp_path: Path) -> None:
    modules = _run_modules(tmp_path)
    assert _imported(modules, RUN_LATER + ("torchdoctor._virtual", "torchdoctor._scan", "torchdoctor._env")) == []


def test_run_on_a_virtual_device_imports_no_explain_before_an_error(tmp_path: Path) -> None:
    modules = _run_modules(tmp_path, "--device", "cuda:1")
    assert "torchdoctor._virtual.session" in modules
    assert _imported(modules, RUN_LATER) == []
