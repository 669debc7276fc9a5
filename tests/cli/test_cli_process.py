"""The command line as a process: a TARGET that ends the process or never returns is exit 2 with one line;
checkpoints are read without importing torch; the CLI items of a new user's first hour (issue 27, point 8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from torchdoctor._cli.main import main

ENV = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", COLUMNS="200")
ENV.pop("NO_COLOR", None)
ENV.pop("FORCE_COLOR", None)
# a process whose imports are audited runs without the suite's sitecustomize (it pins bitsandbytes' branch, and
# imports pathlib to do so): what is counted is torchdoctor's own
AUDIT_ENV = dict(ENV, PYTHONPATH=os.pathsep.join(
    p for p in ENV.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.basename(p) != "site"))

APP = textwrap.dedent(
    """
    import os, sys, threading, time
    from torch import nn

    def model():
        return nn.Linear(2, 2)

    def broken():
        m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
        m[1].bias.data = m[1].bias.data.double()
        return m

    def hard_exit():
        os._exit(0)

    class Exits(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            os._exit(0)

    def exits_in_forward():
        import logging, torch
        # what bitsandbytes logs at import on CPUs with AVX512-BF16: a third party's line on the same stderr
        logging.getLogger("bitsandbytes.cextension").warning(
            "Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'")
        return Exits(), (torch.ones(1, 2),)

    def never_returns():
        time.sleep(600)

    def leaves_a_thread():
        threading.Thread(target=time.sleep, args=(600,)).start()  # not a daemon: would keep a process alive
        return nn.Linear(2, 2)
    """
)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("app") / "my_app.py"
    path.write_text(APP)
    return path


def own_lines(stderr: str) -> list[str]:
    """torchdoctor's own lines of stderr: a third-party library's (bitsandbytes logs one at import on some CPUs)
    are not torchdoctor's to count."""
    return [line for line in stderr.strip().splitlines() if line.startswith("torchdoctor")]


def cli(*argv: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchdoctor", *argv], capture_output=True, text=True,
                          env=env or ENV, timeout=timeout, stdin=subprocess.DEVNULL)


def test_os_exit_in_a_target_is_exit_2_with_one_line(app: Path) -> None:
    out = cli("scan", f"{app}:hard_exit")
    assert out.returncode == 2 and out.stdout == "" and "Traceback" not in out.stderr
    assert own_lines(out.stderr) == [
        f"torchdoctor scan: {app}:hard_exit: the TARGET ended the process (exit code 0; os._exit or sys.exit in its "
        "code?) before the check finished: nothing was checked"]


def test_os_exit_in_a_simulated_forward_is_exit_2(app: Path) -> None:
    out = cli("simulate", f"{app}:exits_in_forward", "--device", "cuda:0")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "Failed to load CPU gemm_4bit_forward" in out.stderr  # the third party's line is there, not counted
    assert own_lines(out.stderr) == [
        f"torchdoctor simulate: {app}:exits_in_forward: the TARGET ended the process (exit code 0; os._exit or "
        "sys.exit in its code?) before the check finished: nothing was checked"]


def test_the_failing_target_of_several_is_named(app: Path) -> None:
    out = cli("scan", f"{app}:model", f"{app}:hard_exit", "--json")
    assert out.returncode == 2
    assert f"{app}:hard_exit: the TARGET ended the process" in out.stderr


def test_timeout_stops_a_target_that_never_returns(app: Path) -> None:
    t0 = time.monotonic()
    out = cli("scan", f"{app}:never_returns", "--timeout", "4", timeout=60)
    assert time.monotonic() - t0 < 40
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert own_lines(out.stderr) == [
        f"torchdoctor scan: {app}:never_returns: still running after 4 s (--timeout); stopped, nothing was checked"]


def test_a_finished_check_does_not_wait_for_threads_the_target_left(app: Path) -> None:
    out = cli("scan", f"{app}:leaves_a_thread", timeout=90)
    assert out.returncode == 0 and out.stdout.startswith("ok: no placement problems")


def test_output_and_codes_are_those_of_the_in_process_run(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, code in (("model", 0), ("broken", 1)):
        out = cli("scan", f"{app}:{name}")
        assert main(["scan", f"{app}:{name}"]) == code == out.returncode
        assert capsys.readouterr().out == out.stdout


def test_timeout_must_be_positive(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", f"{app}:model", "--timeout", "0"]) == 2
    assert "--timeout: expected a number of seconds > 0, got 0" in capsys.readouterr().err


def test_checkpoint_scan_never_imports_torch(tmp_path: Path) -> None:
    """The scan of files goes to the checkpoint command before anything imports torch (checked by blocking it)."""
    (tmp_path / "not_weights.bin").write_bytes(b"\x00\x01 not a checkpoint")
    code = ("import sys; sys.modules['torch'] = None\n"  # any `import torch` now raises ImportError
            "from torchdoctor._cli.main import main, _all_paths, _checkpoint_command\n"
            f"import argparse; assert _all_paths([{str(tmp_path / 'not_weights.bin')!r}])\n"
            "print('routed' if _checkpoint_command(argparse.Namespace()) is not None else 'no command yet')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in ("routed", "no command yet")


# The real command line in a child process, which writes the modules it ended with to the file named first.
_AUDIT = textwrap.dedent(
    """
    import atexit, runpy, sys
    record = sys.argv.pop(1)

    def _write():
        names = sorted(sys.modules)
        with open(record, "w") as f:
            f.write("\\n".join(names))

    atexit.register(_write)
    sys.argv[0] = "torchdoctor"
    runpy.run_module("torchdoctor", run_name="__main__", alter_sys=True)
    """
)
# What the checkpoint command line must never load: torch (seconds), importlib.metadata (once built for --version
# at every start, more than a whole scan), and the libraries a checkpoint is read without.
_NEVER = ("torch", "importlib.metadata", "numpy", "safetensors")
_PICKLE_READERS = ("torchdoctor._checkpoint.torchfile", "torchdoctor._checkpoint.unpickle",
                   "torchdoctor._checkpoint.records", "torchdoctor._checkpoint.rebuild",
                   "torchdoctor._checkpoint.stubs", "torchdoctor._checkpoint.bounds", "zipfile")


# What the checkpoint path no longer loads and must not load again (issue 30): dataclasses (it imports inspect, ast
# and dis, and compiles methods per class), the Python API's result types, the rules of problems of live models,
# the progress thread, and the other verbs' command modules (the parser builds only the verb asked for).
_NOT_ON_THE_PATH = ("dataclasses", "inspect", "ast", "textwrap", "torchdoctor._report.model",
                    "torchdoctor._report.order", "torchdoctor._report.progress", "torchdoctor._report.html",
                    "torchdoctor._cli.scan", "torchdoctor._cli.simulate", "torchdoctor._cli.explain",
                    "torchdoctor._cli.env", "torchdoctor._cli.trace", "torchdoctor._cli.demo", "torchdoctor._cli.run")
# zipfile and what it imports: a torch.save archive of the shape torch writes is read without them (zipfast.py).
_ZIP_ONLY = ("zipfile", "shutil", "threading", "pathlib", "bz2", "lzma")
# What a file saved on cpu without a config.json beside it, scanned without --dtype, does not need (issue 28): the
# device counts (only a location other than cpu asks) and the dtype expectation (only dtype= or a config.json).
_CPU_NO_CONFIG = ("torchdoctor._checkpoint.devices", "torchdoctor._checkpoint.expect")
# ... and a safetensors header, which names no pickle global: the allow-list, torch's own records, the verdicts on
# globals, and the checks of pickle tensor records (only a refused header's message uses views' dims_text).
_NO_PICKLE_GLOBALS = ("torchdoctor._checkpoint.names", "torchdoctor._checkpoint.known", "torchdoctor._checkpoint.unsafe",
                      "torchdoctor._checkpoint.views")


@pytest.mark.parametrize("output", ["text", "json"])
@pytest.mark.parametrize("kind", ["legacy", "zip", "safetensors"])
def test_checkpoint_cli_process_loads_only_what_the_format_needs(tmp_path: Path, kind: str, output: str) -> None:
    """``torchdoctor scan FILE`` as a whole process: neither torch nor importlib.metadata, only the readers of the
    file's own format (a legacy pickle never loads zipfile; a safetensors header no pickle reader), and none of
    what the checkpoint path was made to do without (``_NOT_ON_THE_PATH``)."""
    import torch

    path = tmp_path / {"legacy": "m.pt", "zip": "m.pt", "safetensors": "m.safetensors"}[kind]
    sd = {f"layers.{i}.weight": torch.zeros(4, dtype=torch.bfloat16) for i in range(50)}
    if kind == "safetensors":
        from safetensors.torch import save_file

        save_file(sd, str(path))
    else:
        torch.save(sd, path, _use_new_zipfile_serialization=kind == "zip")
    record = tmp_path / "modules.txt"
    argv = ["scan", str(path)] + (["--json"] if output == "json" else [])
    out = subprocess.run([sys.executable, "-c", _AUDIT, str(record), *argv],
                         capture_output=True, text=True, env=AUDIT_ENV, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    if output == "json":
        assert len(json.loads(out.stdout)["tensors"]) == 50
    else:
        assert ": 50 tensors, " in out.stdout and "ok: no problems found" in out.stdout
    modules = set(record.read_text().split())
    assert "torchdoctor._checkpoint.scan" in modules  # the record is of a process that did scan
    loaded = sorted(m for m in modules if m.split(".")[0] in _NEVER or m.startswith("importlib.metadata"))
    assert loaded == []
    assert sorted(m for m in _NOT_ON_THE_PATH if m in modules) == []
    assert sorted(m for m in _ZIP_ONLY if m in modules) == []
    if kind == "legacy" and output == "text":
        assert "json" not in modules
    assert sorted(m for m in _CPU_NO_CONFIG if m in modules) == []
    if kind == "safetensors":
        assert [m for m in _PICKLE_READERS + _NO_PICKLE_GLOBALS if m in modules] == []


def test_checkpoint_json_with_problems_loads_no_relocations(tmp_path: Path) -> None:
    """``scan FILE --json`` with problems: a checkpoint report has no component whose device was asked with a rule,
    so it has no relocations to set apart, and the process loads neither ``_report.order`` nor dataclasses."""
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "m.safetensors"
    save_file({f"layers.{i}.weight": torch.zeros(4, dtype=torch.bfloat16) for i in range(8)}, str(path))
    record = tmp_path / "modules.txt"
    out = subprocess.run([sys.executable, "-c", _AUDIT, str(record), "scan", str(path), "--json", "--dtype", "float16"],
                         capture_output=True, text=True, env=AUDIT_ENV, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert [p["kind"] for p in doc["problems"]] == ["dtype"] and doc["relocations"] == []
    modules = set(record.read_text().split())
    assert "torchdoctor._checkpoint.expect" in modules  # the record is of a process that judged dtypes
    assert sorted(m for m in _NOT_ON_THE_PATH if m in modules) == []


# The Python API's first scan of a checkpoint path, in a fresh process after `import torch, torchdoctor` (issue 28,
# the first call of a checkpoint scan): the modules a bare safetensors file does not need stay unloaded.
_API_FIRST_SCAN = textwrap.dedent(
    """
    import sys, torch, torchdoctor
    before = set(sys.modules)
    report = torchdoctor.scan(sys.argv[1])
    assert report.ok and len(report.tensors) == 50, report
    print("\\n".join(sorted(set(sys.modules) - before)))
    """
)
_NOT_ON_THE_API_PATH = ("torchdoctor._checkpoint.render", "torchdoctor._report.html_assets",
                        "torchdoctor._report.layout", "torchdoctor._walk", "torchdoctor._scan.policy",
                        "torchdoctor._report.order")


def test_api_first_scan_of_a_safetensors_file_loads_only_its_path(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "m.safetensors"
    save_file({f"layers.{i}.weight": torch.zeros(4, dtype=torch.bfloat16) for i in range(50)}, str(path))
    out = subprocess.run([sys.executable, "-c", _API_FIRST_SCAN, str(path)], capture_output=True, text=True, env=ENV,
                         timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    new = set(out.stdout.split())
    assert "torchdoctor._checkpoint.safetensors" in new  # the record is of a process that read the file
    never = _NOT_ON_THE_API_PATH + _PICKLE_READERS + _NO_PICKLE_GLOBALS + _CPU_NO_CONFIG
    assert sorted(m for m in never if m in new) == []


def test_version_is_built_when_asked() -> None:
    """``--version`` still names torch's version (read from its metadata, never by importing torch)."""
    out = subprocess.run([sys.executable, "-m", "torchdoctor", "--version"], capture_output=True, text=True, env=ENV,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("torchdoctor ") and "(torch " in out.stdout and "Python " in out.stdout


def test_python_file_without_name_says_what_to_type(app: Path) -> None:
    out = cli("scan", str(app))
    assert out.returncode == 2 and "not a checkpoint (unknown format" not in out.stderr
    assert out.stderr.strip() == (
        f"torchdoctor scan: {app} is a Python file, not a checkpoint: name the object to check as {app}:model "
        "(a model, a pipeline, or a function that returns one, called with no arguments); it defines model, "
        "broken, hard_exit, Exits, exits_in_forward, never_returns, leaves_a_thread")


def test_simulate_profile_help_needs_no_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--profile", "help"]) == 0
    out = capsys.readouterr().out
    assert "t4" in out and "a100" in out
    assert main(["simulate", "--device", "cuda:0"]) == 2
    assert capsys.readouterr().err.strip() == "torchdoctor simulate: the following arguments are required: TARGET"


def test_several_targets_json_keeps_a_failed_target_as_an_error_entry(app: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", f"{app}:model", f"{app}:nope", f"{app}:broken", "--json"]) == 2
    docs = json.loads(capsys.readouterr().out)
    assert [d["source"] for d in docs] == [f"{app}:model", f"{app}:nope", f"{app}:broken"]
    assert docs[1] == {"schema": "torchdoctor/scan/1", "ok": False, "source": f"{app}:nope",
                       "error": f"{str(app)!r} has no attribute 'nope'"}
    assert docs[2]["problems"][0]["path"] == "1.bias"


@pytest.mark.parametrize(("flag", "env", "coloured"), [
    (None, {}, False),                                  # a pipe: plain
    (None, {"FORCE_COLOR": "1"}, True),                 # CI logs
    (None, {"FORCE_COLOR": "1", "NO_COLOR": "1"}, False),  # NO_COLOR wins over the environment's FORCE_COLOR
    ("always", {"NO_COLOR": "1"}, True),                # the flag wins over both
    ("never", {"FORCE_COLOR": "1"}, False),
    (None, {"FORCE_COLOR": "0"}, False),
])
def test_color_flag_and_environment(app: Path, flag: str | None, env: dict[str, str], coloured: bool) -> None:
    pytest.importorskip("rich")
    argv = ["scan", f"{app}:broken"] + (["--color", flag] if flag else [])
    out = cli(*argv, env={**ENV, **env})
    assert out.returncode == 1
    assert ("\x1b[" in out.stdout) is coloured
    assert "1.bias" in out.stdout


def test_trace_exit_codes_are_documented(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Exit codes: the script's own, as `python SCRIPT` would give it" in text
    assert "the changes recorded never set it. 2 for bad usage" in text
