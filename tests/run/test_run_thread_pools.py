"""A program that still holds a thread pool when it ends (in a global of the script, or of a module it imported:
a download helper, an offloader's worker, a web server's pool) ends under ``torchdoctor run`` as under python: the
queued work runs, then the summary; run never waits on an idle worker. Every run is under a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TIMEOUT = 120
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

HELPER = """
    from concurrent.futures import ThreadPoolExecutor
    POOL = ThreadPoolExecutor(max_workers=2)
"""

PROGRAM = """
    import time
    from concurrent.futures import ThreadPoolExecutor
    import torch
    import helper_pool

    pool = ThreadPoolExecutor(max_workers=1)
    print(pool.submit(sum, [1, 2]).result(), flush=True)
    print(helper_pool.POOL.submit(sum, [3, 4]).result(), flush=True)

    def late(n):
        time.sleep(0.3)
        print(f"queued work {n} done", flush=True)

    pool.submit(late, 1)
    pool.submit(late, 2)  # queued behind the first: still runs before the program ends, as under python
    x = torch.ones(2, device=DEVICE)
    print("main done", flush=True)
"""


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_program_holding_thread_pools_ends_after_its_queued_work(tmp_path: Path, device: str) -> None:
    (tmp_path / "helper_pool.py").write_text(textwrap.dedent(HELPER))
    (tmp_path / "app.py").write_text(textwrap.dedent(PROGRAM).replace("DEVICE", repr(device)))
    plain = subprocess.run([sys.executable, "app.py"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                           timeout=TIMEOUT, stdin=subprocess.DEVNULL) if device == "cpu" else None
    args = ["--device", "cuda"] if device == "cuda" else []
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "run", *args, "app.py"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["3", "7"]
    assert set(lines[2:5]) == {"main done", "queued work 1 done", "queued work 2 done"}
    assert "no placement error" in proc.stderr and "Traceback" not in proc.stderr
    if plain is not None:
        assert plain.returncode == 0 and plain.stdout.splitlines() == lines


def test_run_called_in_a_process_with_its_own_pool_leaves_that_pool_working(tmp_path: Path) -> None:
    """``run()`` in a process that already runs a pool: only the program's threads are waited for, and the
    caller's pool still takes work afterwards (no process-wide exit hook was run)."""
    from concurrent.futures import ThreadPoolExecutor

    from torchdoctor._run.program import run

    (tmp_path / "helper_pool.py").write_text(textwrap.dedent(HELPER))
    (tmp_path / "app.py").write_text(textwrap.dedent(PROGRAM).replace("DEVICE", "'cpu'"))
    mine = ThreadPoolExecutor(max_workers=1)
    assert mine.submit(sum, [1, 1]).result() == 2
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        report = run(str(tmp_path / "app.py"))
    finally:
        os.chdir(cwd)
        sys.modules.pop("helper_pool", None)
    assert report.exit_code == 0
    assert mine.submit(sum, [2, 2]).result(timeout=30) == 4
    mine.shutdown()
