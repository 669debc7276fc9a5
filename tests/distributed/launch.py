"""Launch real ranks with ``python -m torch.distributed.run --standalone`` under a timeout (nothing may hang). Every
rank takes the bitsandbytes CPU branch it is given (``branch``, tests/support/hardware.py), whatever this CPU is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import hardware

WORKERS = Path(__file__).parent / "workers"
TIMEOUT = 240  # seconds per launch; a 4-rank launch takes about 15 s here
GROUP = "torchrun-two-ranks"  # the xdist_group of the modules that share the 2-rank launch (conftest.py)


def torchrun(nproc: int, *argv: str, env: dict[str, str] | None = None, timeout: float = TIMEOUT,
             cwd: str | os.PathLike[str] | None = None, branch: str = "portable"
             ) -> subprocess.CompletedProcess[str]:
    full_env = hardware.child_env(branch, {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                                           "PYTHONWARNINGS": "ignore", "TORCHELASTIC_ERROR_FILE": "", **(env or {})})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *argv]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd, check=False)
    if done.returncode != 0 and "terminate called without an active exception" in done.stderr:
        # gloo's teardown can abort a rank on a loaded 2-core machine after the work is done; a real failure
        # fails the second launch too
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd,
                              check=False)
    return done


def assert_launched(done: subprocess.CompletedProcess[str]) -> None:
    """A launch that failed says why: the lines that name an error or a rank, else the end of its stderr."""
    clues = [line for line in done.stderr.splitlines() if "Error" in line or "terminate" in line or "[rank" in line]
    assert done.returncode == 0, "\n".join(clues[-60:]) or done.stderr[-4000:]
