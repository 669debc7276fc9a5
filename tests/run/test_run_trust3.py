"""``torchdoctor run`` behaves like ``python`` (issue 39, point 7; issue 42, exit codes): a missing ``-m`` module
is python's one line and exit 1; a forked child's ``sys.exit`` prints no second summary; a program that closes
stderr or swaps ``sys.stdout`` keeps its code and the summary still arrives; a folder with ``__main__.py`` runs;
a program that ends well after recording problems is exit 1. Every program runs in a subprocess under a timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TIMEOUT = 300
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchdoctor", "run", *args], cwd=cwd, env=env or ENV,
                          capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)


def python(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=TIMEOUT, stdin=subprocess.DEVNULL)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", ["no_such_module_td", "no_such_pkg_td.sub", "emptypkg"])
def test_a_module_that_cannot_run_is_pythons_one_line_and_exit_1(tmp_path: Path, name: str) -> None:
    write(tmp_path / "emptypkg" / "__init__.py", "")  # a package without __main__.py
    ours, theirs = run("-m", name, cwd=tmp_path), python("-m", name, cwd=tmp_path)
    assert ours.returncode == theirs.returncode == 1
    assert ours.stderr == theirs.stderr and len(ours.stderr.strip().splitlines()) == 1, ours.stderr
    assert "Traceback" not in ours.stderr and ours.stdout == ""


def test_an_import_error_inside_the_module_is_the_programs_own_traceback(tmp_path: Path) -> None:
    write(tmp_path / "tool.py", "import no_such_dependency_td\n")
    proc = run("-m", "tool", cwd=tmp_path)
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr and "No module named 'no_such_dependency_td'" in proc.stderr
    assert "torchdoctor run: -m tool exited with 1" in proc.stderr


def test_trace_too_prints_one_summary_for_a_forking_script(tmp_path: Path) -> None:
    script = write(tmp_path / "forks.py", """
        import os, sys
        pid = os.fork()
        if pid == 0:
            sys.exit(3)
        _, status = os.waitpid(pid, 0)
        print("child ended with", os.waitstatus_to_exitcode(status))
    """)
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "trace", str(script)], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0 and "child ended with 3" in proc.stdout, proc.stderr
    assert proc.stderr.count("torchdoctor trace:") == 1


def test_a_forked_child_that_calls_sys_exit_prints_no_second_summary(tmp_path: Path) -> None:
    script = write(tmp_path / "forks.py", """
        import os, sys
        pid = os.fork()
        if pid == 0:
            print("child", flush=True)
            sys.exit(3)
        _, status = os.waitpid(pid, 0)
        print("child ended with", os.waitstatus_to_exitcode(status))
        sys.exit(5)
    """)
    proc = run(str(script), cwd=tmp_path)
    assert proc.returncode == 5, proc.stderr
    assert "child ended with 3" in proc.stdout  # the child's own code, as under python
    assert proc.stderr.count("torchdoctor run:") == 1
    assert "torchdoctor run: " + str(script) + " exited with 5" in proc.stderr


def test_a_program_that_closes_stderr_ends_with_its_own_code(tmp_path: Path) -> None:
    script = write(tmp_path / "closes.py", """
        import sys
        print("out")
        sys.stderr.close()
    """)
    proc = run(str(script), cwd=tmp_path)
    assert proc.returncode == 0 == python(str(script), cwd=tmp_path).returncode
    assert proc.stdout == "out\n" and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"torchdoctor run: {script} exited with 0")  # the summary still arrives


def test_json_reaches_the_real_stdout_when_the_program_swaps_sys_stdout(tmp_path: Path) -> None:
    script = write(tmp_path / "swaps.py", """
        import io, sys
        print("before")
        sys.stdout = io.StringIO()
        print("swallowed")
    """)
    proc = run("--json", str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("before\n")
    doc = json.loads(proc.stdout[len("before\n"):])
    assert doc["schema"] == "torchdoctor/run/1" and doc["exit_code"] == 0 and doc["ok"]


def test_a_folder_with_main_runs_as_python_runs_it(tmp_path: Path) -> None:
    write(tmp_path / "app" / "__main__.py", """
        import sys
        import helper  # beside __main__.py: the folder is sys.path[0], as under python
        print("argv", sys.argv[1:], helper.NAME)
        sys.exit(4)
    """)
    write(tmp_path / "app" / "helper.py", "NAME = 'helper'\n")
    ours, theirs = run("app", "--x", cwd=tmp_path), python("app", "--x", cwd=tmp_path)
    assert ours.returncode == theirs.returncode == 4, ours.stderr
    assert ours.stdout == theirs.stdout == "argv ['--x'] helper\n"
    (tmp_path / "empty").mkdir()
    proc = run("empty", cwd=tmp_path)
    assert proc.returncode == 2 and "has no __main__.py" in proc.stderr and "Traceback" not in proc.stderr


def test_problems_recorded_by_a_program_that_exits_0_are_exit_1(tmp_path: Path) -> None:
    script = write(tmp_path / "app.py", """
        import torch
        model = torch.nn.Linear(4, 4).to("cuda")
        model.bias.data = model.bias.data.to("cpu")  # left behind
        model(torch.ones(2, 4, device="cuda"))
        print("done")
    """)
    proc = run("--device", "cuda:1", str(script), cwd=tmp_path)
    assert "done" in proc.stdout
    assert "problem(s) recorded" in proc.stderr and "exited with 0" in proc.stderr
    assert proc.returncode == 1, proc.stderr
    clean = write(tmp_path / "clean.py", "import torch\ntorch.nn.Linear(4, 4).to('cuda')(torch.ones(2, 4, device='cuda'))\n")
    assert run("--device", "cuda:1", str(clean), cwd=tmp_path).returncode == 0


def test_color_and_summary_under_an_ascii_stream_encoding(tmp_path: Path) -> None:
    """``run --color never`` is accepted (every verb takes it); a summary naming a non-ASCII tensor under
    ``PYTHONIOENCODING=ascii:strict`` is escaped, never a traceback."""
    script = write(tmp_path / "app.py", """
        import torch

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.größe = torch.nn.Linear(2, 2)

            def forward(self, x):
                return self.größe(x)

        m = M().to("cuda")
        m.größe.bias.data = m.größe.bias.data.cpu()
        m(torch.ones(1, 2, device="cuda"))
    """)
    proc = run("--color", "never", "--device", "cuda:0", str(script), cwd=tmp_path,
               env={**ENV, "PYTHONIOENCODING": "ascii:strict"})
    assert proc.returncode == 1, proc.stderr
    assert "Error" not in proc.stderr and "Traceback" not in proc.stderr
    assert "gr\\xf6\\xdfe.bias" in proc.stderr and "1 problem(s) recorded" in proc.stderr


FORKS_AND_SLEEPS = """
    import os, sys, time
    pid = os.fork()
    if pid == 0:  # a worker the program started: sleeps "forever"
        time.sleep(600)
        os._exit(0)
    with open(sys.argv[1] + ".tmp", "w") as fh:
        fh.write(str(pid))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return not any(line.startswith("State:") and line.split()[1] in ("Z", "X") for line in status.splitlines())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux")
@pytest.mark.parametrize(("verb", "signum", "code"), [("run", 15, 143), ("run", 1, 129), ("trace", 15, 143)])
def test_sigterm_and_sighup_end_what_the_program_started(tmp_path: Path, verb: str, signum: int, code: int) -> None:
    import signal
    import time

    script = write(tmp_path / "server.py", FORKS_AND_SLEEPS)
    pidfile = tmp_path / "worker.pid"
    proc = subprocess.Popen([sys.executable, "-m", "torchdoctor", verb, str(script), str(pidfile)], cwd=tmp_path,
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    worker = None
    try:
        deadline = time.monotonic() + TIMEOUT
        while not pidfile.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        worker = int(pidfile.read_text())
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == code
        assert err.decode().strip().splitlines()[-1] == (
            f"torchdoctor {verb}: stopped by {signal.Signals(signum).name}; the program and the processes it "
            "started were ended")
        deadline = time.monotonic() + 10
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker)
    finally:
        if proc.poll() is None:
            proc.kill()
        if worker is not None and _alive(worker):
            os.kill(worker, 9)
