"""``torchdoctor explain [FILE|-] [--json]`` and ``install_excepthook()``."""

from __future__ import annotations

import io
import json
import pathlib
import subprocess
import sys

import pytest

from torchdoctor._cli.main import main

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
CPU_GPU = "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"


def log_file(tmp_path: pathlib.Path, text: str, name: str = "run.log") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_exit_codes(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", log_file(tmp_path, "all good\nloss=0.1\n")]) == 0
    assert "no known device/dtype error" in capsys.readouterr().out
    assert main(["explain", log_file(tmp_path, "step 1\n" + CPU_GPU + "\n")]) == 1
    out = capsys.readouterr().out
    assert "device_mismatch" in out and 'model.to("cuda:0")' in out and "confirm with: torchdoctor.scan" in out
    assert main(["explain", str(tmp_path / "missing.log")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchdoctor explain: cannot read") and err.count("\n") == 1
    assert main(["explain", str(tmp_path)]) == 2
    assert "directory" in capsys.readouterr().err


def test_json(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (FIXTURES / "quant__ComfyUI_bitsandbytes_NF4-Lora_2.txt").read_text(encoding="utf-8").partition("---\n")[2]
    path = log_file(tmp_path, text + "\n" + CPU_GPU)
    assert main(["explain", path, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "torchdoctor/explain/1" and doc["source"] == path
    cats = [d["category"] for d in doc["diagnoses"]]
    assert sorted(cats) == ["device_mismatch", "quantization_device"]
    d = doc["diagnoses"][0]
    assert {"category", "title", "what_happened", "likely_causes", "fixes", "confirm_with", "confidence",
            "evidence"} <= set(d)
    assert isinstance(d["fixes"][0]["code"], str) and 0 <= d["confidence"] <= 1
    assert main(["explain", log_file(tmp_path, "fine"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"schema": "torchdoctor/explain/1", "source": str(tmp_path / "run.log"),
                                                   "diagnoses": [], "nothing_to_check": False}


def test_stdin_and_undecodable(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xff\xfe junk\n" + CPU_GPU.encode() + b"\n")))
    assert main(["explain", "-"]) == 1
    assert "device_mismatch" in capsys.readouterr().out
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    assert main(["explain"]) == 2  # an empty paste: nothing to check, as scan says of an object without tensors
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 100)
    assert main(["explain", str(binary)]) == 0  # decoded with replacement, nothing recognised


def test_cli_subprocess(tmp_path: pathlib.Path) -> None:
    path = log_file(tmp_path, CPU_GPU)
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "explain", path, "--json"],
                          capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["diagnoses"][0]["category"] == "device_mismatch"
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "explain", "-"], input="nothing\n",
                          capture_output=True, text=True)
    assert proc.returncode == 0


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_install_excepthook() -> None:
    proc = run_python("import torchdoctor\ntorchdoctor.install_excepthook()\ntorchdoctor.install_excepthook()\n"
                      f"raise RuntimeError({CPU_GPU[14:]!r})")
    assert proc.returncode == 1
    assert proc.stderr.startswith("Traceback (most recent call last)")  # the normal traceback first
    assert proc.stderr.count("device_mismatch") == 1  # installing twice does not explain twice
    assert 'model.to("cuda:0")' in proc.stderr
    plain = run_python("import torchdoctor\ntorchdoctor.install_excepthook()\nraise KeyError('x')")
    assert plain.returncode == 1 and "torchdoctor" not in plain.stderr and "KeyError" in plain.stderr


def test_install_excepthook_ipython() -> None:
    """IPython is not installed here: a stand-in shell with IPython's two entry points we use."""
    code = f"""
import sys, types
calls = []
class Shell:
    def set_custom_exc(self, types_, handler):
        calls.append(types_); self.handler = handler
    def showtraceback(self, exc_tuple=None, tb_offset=None):
        print("TRACEBACK", exc_tuple[0].__name__)
shell = Shell()
sys.modules["IPython"] = types.SimpleNamespace(get_ipython=lambda: shell)
import torchdoctor
torchdoctor.install_excepthook(); torchdoctor.install_excepthook()
assert len(calls) == 1, calls
try:
    raise RuntimeError({CPU_GPU[14:]!r})
except RuntimeError as e:
    shell.handler(shell, type(e), e, e.__traceback__)
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("TRACEBACK RuntimeError") and "device_mismatch" in proc.stdout


def test_stdin_on_a_terminal_says_what_it_waits_for() -> None:
    """Issue 27, point 8: `torchdoctor explain` with no FILE on a terminal prints one line on stderr saying it reads
    standard input, then explains what was pasted once the terminal sends end-of-file (a real pty, no mock)."""
    import os
    import pty
    import select
    import time

    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "torchdoctor", "explain"], stdin=follower,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.close(follower)
    try:
        err = ""
        deadline = time.monotonic() + 60
        while "standard input" not in err and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stderr], [], [], 1.0)
            if ready:
                err += proc.stderr.readline()  # type: ignore[union-attr]
        assert "reading the error from standard input" in err and "Ctrl-D" in err
        os.write(leader, (CPU_GPU + "\n").encode() + b"\x04")
        out, rest = proc.communicate(timeout=60)
    finally:
        proc.kill()
        os.close(leader)
    assert proc.returncode == 1 and "device_mismatch" in out and "standard input" not in rest
    piped = subprocess.run([sys.executable, "-m", "torchdoctor", "explain"], input=CPU_GPU, capture_output=True,
                           text=True, timeout=60)
    assert piped.returncode == 1 and piped.stderr == ""  # a pipe gets no hint
