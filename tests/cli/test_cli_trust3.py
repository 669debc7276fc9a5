"""Trust, round three (issue 39, points 4 to 6): no verb writes over a file it reads; a command that runs a
TARGET owns its whole process tree (``--timeout`` and signals end what the TARGET forked; no environment variable
redirects the child's status or turns the limit off); ``[tool.torchdoctor]`` read in every TOML spelling, and
nothing in a config crashes a verb."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from torchdoctor._cli.config import read_config
from torchdoctor._cli.main import main

ENV = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", COLUMNS="200")

APP = textwrap.dedent(
    """
    import os, time
    from torch import nn

    def fn():
        return nn.Linear(2, 2)

    def _fork_a_sleeper():
        pid = os.fork()
        if pid == 0:  # the grandchild: says it is past the fork, then sleeps "forever"
            open(os.environ["PIDFILE"] + ".up", "w").close()
            time.sleep(600)
            os._exit(0)
        with open(os.environ["PIDFILE"] + ".tmp", "w") as fh:
            fh.write(str(pid))
        os.replace(os.environ["PIDFILE"] + ".tmp", os.environ["PIDFILE"])

    def forks_and_sleeps():
        _fork_a_sleeper()
        time.sleep(600)

    def forks_and_returns():
        _fork_a_sleeper()
        return nn.Linear(2, 2)
    """
)


def _own(stderr: str) -> list[str]:
    """torchdoctor's own lines (a library the TARGET imports may log its own)."""
    return [line for line in stderr.strip().splitlines() if line.startswith("torchdoctor")]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with a checkpoint, an app, a script, a package module and a pyproject.toml; the current dir."""
    torch.save({"w": torch.zeros(3)}, tmp_path / "ck.pt")
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / "prog.py").write_text("print('hello')\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text("from torch import nn\ndef fn():\n    return nn.Linear(2, 2)\n")
    (tmp_path / "ckdir").mkdir()
    torch.save({"w": torch.zeros(3)}, tmp_path / "ckdir" / "a.pt")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    os.symlink(tmp_path / "ck.pt", tmp_path / "link.html")
    os.link(tmp_path / "ck.pt", tmp_path / "hard.html")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(("argv", "victim", "fragment"), [
    (["scan", "ck.pt", "--html", "ck.pt"], "ck.pt", "--html ck.pt would overwrite ck.pt, which this command reads"),
    (["scan", "ck.pt", "--html", "link.html"], "ck.pt", "--html link.html would overwrite ck.pt (the same file)"),
    (["scan", "ck.pt", "--html", "hard.html"], "ck.pt", "--html hard.html would overwrite ck.pt (the same file)"),
    (["scan", "ck.pt", "--html", "./sub/../ck.pt"], "ck.pt", "would overwrite ck.pt"),
    (["scan", "app.py:fn", "--html", "app.py"], "app.py", "--html app.py would overwrite app.py"),
    (["scan", "pkg.mod:fn", "--html", "pkg/mod.py"], "pkg/mod.py", "--html pkg/mod.py would overwrite"),
    (["scan", "ckdir", "--html", "ckdir/a.pt"], "ckdir/a.pt", "--html ckdir/a.pt is inside ckdir"),
    (["scan", "app.py:fn", "--html", "pyproject.toml"], "pyproject.toml", "would overwrite"),
    (["simulate", "app.py:fn", "--device", "cuda:0", "--html", "app.py"], "app.py", "--html app.py would overwrite"),
    (["run", "--file", "prog.py", "prog.py"], "prog.py", "--file prog.py would overwrite prog.py"),
    (["trace", "--file", "prog.py", "prog.py"], "prog.py", "--file prog.py would overwrite prog.py"),
])
def test_an_output_over_an_input_is_refused_and_nothing_is_touched(work: Path, argv: list[str], victim: str,
                                                                   fragment: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (work / "sub").mkdir()
    before = _digest(work / victim), (work / victim).stat().st_mtime_ns
    assert main(argv) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and lines[0].endswith("nothing was written"), out.err
    assert lines[0].startswith(f"torchdoctor {argv[0]}: ") and out.out == ""
    assert (_digest(work / victim), (work / victim).stat().st_mtime_ns) == before


def test_an_output_beside_the_inputs_is_still_written(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", "ck.pt", "--html", "map.html"]) == 0
    assert (work / "map.html").read_text().lstrip().lower().startswith("<!doctype html")
    assert main(["scan", "ckdir", "--html", "ckdir/map.html"]) == 0  # a map beside the weights: no weights file


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_standard_stream_appended_to_an_input_is_refused(work: Path, stream: str) -> None:
    """``scan ck.pt --json >> ck.pt``: the shell opens the checkpoint for appending; the command writes nothing
    into it, and says why on the other stream."""
    before = _digest(work / "ck.pt")
    with open(work / "ck.pt", "ab") as sink:
        kwargs = {"stdout": sink, "stderr": subprocess.PIPE} if stream == "stdout" else \
            {"stdout": subprocess.PIPE, "stderr": sink}
        proc = subprocess.run([sys.executable, "-m", "torchdoctor", "scan", "ck.pt", "--json"], cwd=work, env=ENV,
                              timeout=120, stdin=subprocess.DEVNULL, **kwargs)  # type: ignore[call-overload]
    assert proc.returncode == 2
    assert _digest(work / "ck.pt") == before
    said = (proc.stderr if stream == "stdout" else proc.stdout).decode()
    assert said.strip() == (f"torchdoctor scan: standard {'output' if stream == 'stdout' else 'error'} is "
                            "redirected to ck.pt, which this command reads: redirect it to another file; nothing "
                            "was written")


# -- the process tree ---------------------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that is not ours counts as ended)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    state = next((line.split()[1] for line in status.splitlines() if line.startswith("State:")), "?")
    return state not in ("Z", "X")


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while _alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)  # never leave the test's own orphan behind
            return False
        time.sleep(0.05)
    return True


def _wait_for_file(path: Path, proc: subprocess.Popen[bytes], within: float = 120.0) -> None:
    deadline = time.monotonic() + within
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path.name} was never written (the TARGET never forked)"
        time.sleep(0.05)


def _wait_for(path: Path, proc: subprocess.Popen[bytes], within: float = 120.0) -> int:
    _wait_for_file(path, proc, within)
    return int(path.read_text())


posix_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and /proc: Linux")


@posix_only
def test_timeout_ends_what_the_target_forked_and_no_variable_from_outside_redirects_or_disables_it(
        work: Path) -> None:
    env = {**ENV, "PIDFILE": str(work / "pid"), "TORCHDOCTOR_CLI_CHILD": str(work / "notes.txt"),
           "TORCHDOCTOR_CLI_STATE": "{not json"}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "scan", "app.py:forks_and_sleeps", "--timeout", "25"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert time.monotonic() - t0 < 60
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert _own(proc.stderr) == [
        "torchdoctor scan: app.py:forks_and_sleeps: still running after 25 s (--timeout); stopped, nothing was "
        "checked"]
    assert (work / "pid").exists(), "the TARGET did not fork within 25 s"
    assert _gone(int((work / "pid").read_text()))
    assert not (work / "notes.txt").exists()


@posix_only
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_a_signal_ends_the_whole_tree_with_128_plus_n_and_one_line(work: Path, signum: int, code: int) -> None:
    env = {**ENV, "PIDFILE": str(work / "pid")}
    proc = subprocess.Popen([sys.executable, "-m", "torchdoctor", "scan", "app.py:forks_and_sleeps"], cwd=work,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        grandchild = _wait_for(work / "pid", proc)
        # a signal inside the grandchild's own fork (python's after-fork hooks) is printed by python as "Exception
        # ignored ... Traceback", as it would be without torchdoctor: wait until the grandchild is past it
        _wait_for_file(work / "pid.up", proc)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code and b"Traceback" not in err
    assert _own(err.decode()) == [
        f"torchdoctor scan: app.py:forks_and_sleeps: stopped by {signal.Signals(signum).name}; the TARGET and the "
        "processes it started were ended, nothing was checked"]
    assert out == b""
    assert _gone(grandchild)


@posix_only
def test_a_process_the_target_left_running_ends_with_the_check(work: Path) -> None:
    env = {**ENV, "PIDFILE": str(work / "pid"), "TORCHDOCTOR_CLI_CHILD": str(work / "notes.txt")}
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "scan", "app.py:forks_and_returns"], cwd=work,
                          env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok: no placement problems in app.py:forks_and_returns")
    assert _gone(int((work / "pid").read_text()))
    assert not (work / "notes.txt").exists()


# -- [tool.torchdoctor] -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", [
    '[tool.torchdoctor]\ndevice = "cuda:1"',
    "[tool.'torchdoctor']\ndevice = \"cuda:1\"",
    '[tool."torchdoctor"]\ndevice = "cuda:1"',
    '[tool."torch\\u0064octor"]\ndevice = "cuda:1"',
    '[tool]\ntorchdoctor = { device = "cuda:1" }',
    'tool.torchdoctor.device = "cuda:1"',
    '[tool]\ntorchdoctor.device = "cuda:1"',
    "tool = { torchdoctor = { device = 'cuda:1' } }",
])
def test_every_toml_spelling_of_the_table_is_read(tmp_path: Path, spelling: str) -> None:
    (tmp_path / "pyproject.toml").write_text(f"[project]\nname = 'x'\n\n{spelling}\n" if spelling.startswith("[")
                                             else f"{spelling}\n[project]\nname = 'x'\n")
    assert read_config(str(tmp_path)) == (str(tmp_path / "pyproject.toml"), {"device": "cuda:1"})


@pytest.mark.parametrize(("body", "fragment"), [
    ('[tool]\ntorchdoctor = { device = "cuda:x" }', "[tool.torchdoctor] device 'cuda:x' is not a device"),
    ("tool.torchdoctor.dtype = 'int8'", "[tool.torchdoctor] dtype 'int8': a floating dtype is expected"),
    ("[tool.'torchdoctor']\ndtype = 'bf17'", "[tool.torchdoctor] dtype: not a dtype: 'bf17'"),
    ('[tool."torchdoctor"]\nassume_device = "gpu"', "[tool.torchdoctor] assume_device 'gpu' is not a device"),
    ("[tool]\ntorchdoctor = 3", "tool.torchdoctor must be a table ([tool.torchdoctor]), got 3"),
    ("[tool.torchdoctor]\ndevice = [[1]]", "[tool.torchdoctor] device must be a str, got an array of 1 item(s)"),
    ("[tool.torchdoctor]\nx = " + "[" * 50_000 + "]" * 50_000, "is nested too deeply to read"),
    ("[tool.torchdoctor]\ndevice = " + "[" * 50_000 + "]" * 50_000, "is nested too deeply to read"),
])
def test_a_bad_config_in_any_spelling_is_exit_2_naming_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               body: str, fragment: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    torch.save({"w": torch.zeros(2)}, tmp_path / "ck.pt")
    (tmp_path / "pyproject.toml").write_text(f"{body}\n")
    monkeypatch.chdir(tmp_path)
    for argv in (["scan", "ck.pt"], ["scan", "ck.pt", "--json"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in err, err[:500]
        assert lines[0].startswith(f"torchdoctor scan: {tmp_path / 'pyproject.toml'}")


def test_a_config_without_the_table_is_not_parsed_and_a_tool_that_is_not_a_table_is_no_config(
        tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.black]\nline-length = 120\n")
    assert read_config(str(tmp_path)) == (str(tmp_path / "pyproject.toml"), {})
    (tmp_path / "pyproject.toml").write_text("tool = 3\n[project]\nname = 'torchdoctor-user'\n")
    assert read_config(str(tmp_path)) == (str(tmp_path / "pyproject.toml"), {})


# -- any encoding, any file name ------------------------------------------------------------------------------------

UNICODE_APP = textwrap.dedent(
    """
    import torch
    from torch import nn

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.größe = nn.Linear(2, 2)
            self.größe.bias.data = self.größe.bias.data.double()

    def m():
        return M()
    """
)
LOG = ("Traceback (most recent call last):\n  File \"/home/jürgen/größe.py\", line 3, in <module>\n"
       "RuntimeError: expected m1 and m2 to have the same dtype, but got: float != c10::BFloat16\n")


@pytest.mark.parametrize("encoding", ["ascii", "ascii:strict", "latin-1"])
@pytest.mark.parametrize("argv", [["scan", "uni.py:m"], ["scan", "uni.py:m", "--json"],
                                  ["simulate", "uni.py:m", "--device", "cuda:0"], ["explain", "log.txt"],
                                  ["scnä"], ["run", "nöpe.py"], ["scan", "nöpe.py:m"]])
def test_no_verb_fails_on_a_character_its_streams_cannot_encode(tmp_path: Path, argv: list[str],
                                                                 encoding: str) -> None:
    (tmp_path / "uni.py").write_text(UNICODE_APP, encoding="utf-8")
    (tmp_path / "log.txt").write_text(LOG, encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", *argv], cwd=tmp_path, capture_output=True,
                          env={**ENV, "PYTHONIOENCODING": encoding}, timeout=300, stdin=subprocess.DEVNULL)
    err = proc.stderr.decode("latin-1")
    assert "Traceback" not in err and "UnicodeEncodeError" not in err
    if "ö" in " ".join(argv) or "ä" in argv[0]:  # usage errors naming what was typed: one line, exit 2
        assert proc.returncode == 2 and len(err.strip().splitlines()) == 1, err
        return
    assert proc.returncode == 1, err
    out = proc.stdout.decode("latin-1")
    if argv[0] != "explain":
        assert ("gr\\xf6\\xdfe" in out or "gr\xf6\xdfe" in out or "gr\\u00f6\\u00dfe" in out), out[:400]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a file name of arbitrary bytes: Linux")
def test_a_target_file_whose_name_is_not_utf8_loads(tmp_path: Path) -> None:
    name = b"caf\xe9_model.py"
    with open(os.path.join(os.fsencode(tmp_path), name), "wb") as fh:
        fh.write(b"from torch import nn\ndef fn():\n    return nn.Linear(2, 2)\nif __name__ == '__main__':\n"
                 b"    print('ran')\n")
    env = {**ENV, "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
    for argv, code in (([b"scan", name + b":fn"], 0), ([b"scan", name + b":fn", b"--json"], 0),
                       ([b"scan", name + b":nope"], 2), ([b"run", name], 0), ([b"trace", name], 0)):
        proc = subprocess.run([os.fsencode(sys.executable), b"-m", b"torchdoctor", *argv], cwd=tmp_path,
                              capture_output=True, env=env, timeout=300, stdin=subprocess.DEVNULL)
        assert proc.returncode == code, (argv, proc.stderr[-800:])
        assert b"Traceback" not in proc.stderr and b"UnicodeEncodeError" not in proc.stderr
        if argv[0] != b"trace":  # trace's summary names no script
            assert b"caf\\udce9_model.py" in proc.stdout + proc.stderr, (argv, proc.stdout[:300], proc.stderr[-300:])
        if argv[0] in (b"run", b"trace"):
            assert proc.stdout.startswith(b"ran\n")


@pytest.mark.parametrize(("table", "code", "fragment"), [
    ('[tool]\ntorchdoctor = { mode = "fix" }', 0,
     "torchdoctor: every test runs under guard(mode='fix'), from [tool.torchdoctor] in"),
    ("tool.torchdoctor.mode = 'loud'", 4, "[tool.torchdoctor] mode 'loud' is not one of off, explain, strict"),
])  # (a pyproject.toml nested too deeply is pytest's own traceback: pytest parses the file before any plugin)
def test_the_pytest_plugin_reads_the_table_with_the_same_reader(tmp_path: Path, table: str, code: int,
                                                                fragment: str) -> None:
    (tmp_path / "pyproject.toml").write_text(f"{table}\n")
    (tmp_path / "test_one.py").write_text("def test_one():\n    assert True\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "test_one.py"], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert fragment in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr) < 2000
