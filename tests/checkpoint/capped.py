"""Run the real CLI (``torchdoctor scan ...``) in a child process under a timeout and an address-space cap.

One child runs several scans (importing torch costs seconds on a loaded machine); each scan's exit code,
output, CPU time and peak-RSS growth come back as one record. CPU time, not wall time: a bomb burns CPU however
loaded the machine is, while a scan waiting for a core (other processes, ``pytest -n 2``) does not; a scan that
hangs without burning CPU outlives the child's timeout. Going over the cap makes allocations fail
inside the child: a scan whose output mentions ``MemoryError`` or that grows the peak RSS past its allowance
is a failure, and so is a child that dies or outlives the timeout. An audit hook in the child records every
call that would run code or change files (``os.system``, ``subprocess.Popen``, the default
``pickle.find_class``, ``os.remove``):
any of them during a scan is a failure, whatever the file's payload.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

CAP = 2 * 1024**3  # address space; importing torch alone maps about 0.65 GB here
SRC = str(Path(__file__).resolve().parents[2] / "src")

_CHILD = r"""
import contextlib, io, json, resource, sys, time
from torchdoctor._cli.main import main
WATCH = ("os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "subprocess.Popen", "pickle.find_class",
         "os.remove", "os.rename", "shutil.rmtree", "os.chmod", "os.truncate")  # (imports exec and compile)
events = []
sys.addaudithook(lambda event, args: events.append(event) if event.startswith(WATCH) else None)
for line in sys.stdin:
    argv = json.loads(line)
    out, err = io.StringIO(), io.StringIO()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    del events[:]
    t0 = time.process_time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 2
        except BaseException as exc:  # a traceback is a failure of the test, reported as such
            import traceback
            traceback.print_exc(file=err)
            rc = -1
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(json.dumps({"argv": argv, "rc": rc, "out": out.getvalue(), "err": err.getvalue(),
                      "seconds": time.process_time() - t0, "rss_growth_mb": grew / 1024,
                      "events": sorted(set(events))}), flush=True)
"""


@dataclass
class Run:
    argv: list[str]
    rc: int
    out: str
    err: str
    seconds: float  # CPU time of the scan (every thread of the child)
    rss_growth_mb: float
    events: list[str]  # audited calls that run code (os.system, pickle.find_class, exec, ...) during the scan

    @property
    def text(self) -> str:
        return self.out + self.err


def _limits(cap: int, honour_permissions: bool):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        if honour_permissions and os.geteuid() == 0:  # root reads every file: drop the two capabilities
            import ctypes  # that bypass permission bits (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH) from the
            libc = ctypes.CDLL(None, use_errno=True)  # bounding set, so the child is root without them
            for capability in (1, 2):
                if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                    raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")

    return apply


def run_scans(argvs: list[list[str]], *, cap: int = CAP, timeout: float = 300, honour_permissions: bool = False
              ) -> list[Run]:
    """``torchdoctor <argv>`` for each argv, in one capped child; raises if the child dies or times out."""
    env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    stdin = "".join(json.dumps(a) + "\n" for a in argvs)
    proc = subprocess.run([sys.executable, "-c", _CHILD], input=stdin, capture_output=True, text=True,
                          timeout=timeout, env=env, preexec_fn=_limits(cap, honour_permissions), cwd="/")
    runs = [Run(**json.loads(line)) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and len(runs) == len(argvs), (proc.returncode, proc.stderr[-3000:])
    return runs


def assert_bounded(run: Run, seconds: float = 30, rss_mb: float = 400) -> None:
    """No traceback, no MemoryError, one-line error, and CPU time and memory within their allowance."""
    assert run.rc in (0, 1, 2), run
    assert not run.events, (run.argv, run.events)  # no pickle code, no process, no exec: ever
    assert "Traceback" not in run.text and "MemoryError" not in run.text, run.text[-2000:]
    assert run.seconds < seconds, (run.argv, run.seconds)
    assert run.rss_growth_mb < rss_mb, (run.argv, run.rss_growth_mb)
    if run.rc == 2:
        assert run.err.count("\n") <= 1, run.err
