"""The command line's options and configuration: --version, --profile presets, [tool.torchdoctor], several
TARGETs, callable targets, "nothing to check", validated numbers, --html, --plan's schema, a broken pipe,
progress and colour on a real terminal (a pty), and the pre-commit hook."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from torchdoctor._cli.main import main

MODELS = textwrap.dedent(
    """
    import functools, time
    import torch
    from torch import nn

    def broken():
        m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        m[1].bias.data = m[1].bias.data.double()
        return m

    def fine():
        return nn.Sequential(nn.Linear(4, 4))

    def make(n):
        return nn.Sequential(*[nn.Linear(4, 4) for _ in range(n)])

    part = functools.partial(make, 3)

    def returns_partial():
        return functools.partial(make, 2)

    relu = nn.ReLU()

    def config_only():
        return {"lr": 0.1}

    def bf16_linear():
        return (nn.Linear(4, 4).to(torch.bfloat16), (torch.ones(1, 4, dtype=torch.bfloat16),))

    def bf16_conv():
        return (nn.Conv2d(3, 4, 3).to(torch.bfloat16), (torch.ones(1, 3, 8, 8, dtype=torch.bfloat16),))

    def big():
        return nn.Sequential(*[nn.Linear(2, 2) for _ in range(600)]).double()

    def slow():
        time.sleep(1.8)
        return broken()
    """
)

ENV = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
ENV.pop("NO_COLOR", None)
ENV.pop("COLUMNS", None)


@pytest.fixture()
def models(tmp_path: Path) -> str:
    (tmp_path / "models.py").write_text(MODELS)
    return str(tmp_path / "models.py")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import torchdoctor

    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"torchdoctor {torchdoctor.__version__} (torch {torch.__version__.split('+')[0]}")


def test_profile_t4_flags_bf16_conv_and_a100_does_not(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", f"{models}:bf16_conv", "--profile", "t4", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["profile"]["capability"] == [7, 5] and doc["profile"]["name"] == "NVIDIA T4 16GB"
    assert [(p["kind"], p["found"]) for p in doc["problems"]][0] == ("unsupported_dtype", "bfloat16")
    assert doc["device"] == "cuda:0"
    assert main(["simulate", f"{models}:bf16_conv", "--profile", "a100"]) == 0
    assert capsys.readouterr().out.startswith("ok: no placement problems")
    assert main(["simulate", f"{models}:bf16_linear", "--profile", "t4"]) == 0  # a bf16 matmul runs emulated there
    assert capsys.readouterr().out.startswith("ok: no placement problems")


def test_profile_mps_and_cpu_presets(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", f"{models}:fine", "--profile", "m2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["device"] == "mps:0"
    assert main(["simulate", f"{models}:fine", "--profile", "help"]) == 0
    listing = capsys.readouterr().out
    for name in ("t4", "v100", "a100", "h100", "l4", "rtx3090", "rtx4090", "m1", "m2", "m3", "arc", "cpu"):
        assert f"\n{name} " in "\n" + listing, name


@pytest.mark.parametrize(("argv", "fragment"), [
    (["simulate", "{m}:fine", "--profile", "k80"], "unknown device profile 'k80'; known profiles: p100, v100, t4"),
    (["simulate", "{m}:fine", "--profile", "m2", "--device", "cuda:0"], "--profile m2 is a mps device"),
    (["simulate", "{m}:fine", "--device", "cuda:7", "--count", "2"],
     "--count 2 gives cuda:0..1, but --device cuda:7 needs at least 8 devices"),
    (["simulate", "{m}:fine"], "simulate needs --device (e.g. cuda:1, mps, xpu) or --profile"),
    (["simulate", "{m}:fine", "--device", "mps:1"], "--device mps:1: a Mac has one GPU, mps (mps:0); there is no mps:1"),
    (["simulate", "{m}:fine", "--profile", "m2", "--count", "2"], "--count 2: a Mac has one GPU (mps)"),
    (["run", "--device", "mps:1", "{m}"], "--device mps:1: a Mac has one GPU, mps (mps:0)"),
    (["run", "--device", "mps", "--count", "2", "{m}"], "--count 2: a Mac has one GPU (mps); --count is for cuda"),
    (["run", "--device", "cuda", "--dtype", "int8", "{m}"], "--dtype int8: a floating dtype is expected"),
    (["scan", "{m}:relu"], "nothing to check: {m}:relu holds no tensors (a ReLU)"),
    (["scan", "{m}:config_only"], "nothing to check: {m}:config_only holds no tensors (a dict)"),
    (["scan", "{m}:fine", "{m}:broken", "--html", "x.html"], "--html writes the map of one TARGET"),
])
def test_usage_errors(models: str, argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([a.replace("{m}", models) for a in argv]) == 2
    err = capsys.readouterr().err
    own = [line for line in err.strip().splitlines() if line.startswith("torchdoctor")]  # not a library's log
    assert "Traceback" not in err and len(own) == 1 and fragment.replace("{m}", models) in own[0]


@pytest.mark.parametrize("argv", [["scan", "{m}:fine", "--limit", "-1"], ["scan", "{m}:fine", "--limit", "0"],
                                  ["simulate", "{m}:fine", "--device", "cuda", "--count", "0"],
                                  ["simulate", "{m}:fine", "--device", "cuda", "--count", "two"]])
def test_numbers_are_validated(models: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([a.replace("{m}", models) for a in argv]) == 2
    err = capsys.readouterr().err
    own = [line for line in err.strip().splitlines() if line.startswith("torchdoctor")]  # not a library's log
    assert len(own) == 1 and "expected a whole number >= 1" in own[0]


def test_callable_targets_are_called(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", f"{models}:part", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["tensors"]) == 6  # partial(make, 3): three Linear layers
    assert main(["scan", f"{models}:returns_partial", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["tensors"]) == 4


def test_several_targets_worst_exit_code_and_json_list(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", f"{models}:fine", f"{models}:broken", "--json"]) == 1
    docs = json.loads(capsys.readouterr().out)
    assert [d["source"] for d in docs] == [f"{models}:fine", f"{models}:broken"]
    assert [d["ok"] for d in docs] == [True, False]
    assert main(["scan", f"{models}:fine", f"{models}:relu", f"{models}:broken"]) == 2  # one cannot be checked
    captured = capsys.readouterr()
    assert f"torchdoctor scan: {models}:relu: nothing to check" in captured.err
    assert "ok: no placement problems" in captured.out and "1 problem(s)" in captured.out  # the others still ran
    assert main(["simulate", f"{models}:fine", f"{models}:bf16_conv", "--profile", "t4", "--json"]) == 1
    assert [d["ok"] for d in json.loads(capsys.readouterr().out)] == [True, False]


def test_plan_json_names_its_verb(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", f"{models}:broken", "--plan", "--dtype", "float32", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "torchdoctor/scan/1" and doc["ok"] is False and doc["source"] == f"{models}:broken"
    assert [s["path"] for s in doc["plan"]] == ["1.bias"]


def test_html_option_writes_the_map(models: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "map.html"
    assert main(["scan", f"{models}:broken", "--html", str(page)]) == 1
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and 'data-path="1.bias"' in text
    assert f"device map written to {page}" in capsys.readouterr().err
    sim = tmp_path / "sim.html"
    assert main(["simulate", f"{models}:bf16_conv", "--profile", "t4", "--html", str(sim)]) == 1
    assert "unsupported_dtype" in sim.read_text() and "virtual cuda:0" in sim.read_text()


def _pyproject(where: Path, body: str) -> None:
    (where / "pyproject.toml").write_text(f"[project]\nname = 'x'\n\n[tool.torchdoctor]\n{body}\n")


def test_pyproject_config_from_a_parent_directory(models: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    _pyproject(tmp_path, 'dtype = "bfloat16"\nprofile = "t4"\nlimit = 5')
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    assert main(["scan", f"{models}:fine", "--json"]) == 1  # fp32 model, bf16 expected by the config
    assert {p["expected"] for p in json.loads(capsys.readouterr().out)["problems"]} == {"bfloat16"}
    assert main(["scan", f"{models}:fine", "--dtype", "float32"]) == 0  # the command line wins
    capsys.readouterr()
    assert main(["simulate", f"{models}:bf16_conv", "--json"]) == 1  # profile t4 from the config
    assert json.loads(capsys.readouterr().out)["profile"]["capability"] == [7, 5]


@pytest.mark.parametrize(("body", "fragment"), [
    ('colour = "red"', "[tool.torchdoctor] has no key 'colour'; known keys: device, dtype, profile"),
    ("limit = -3", "[tool.torchdoctor] limit must be >= 1, got -3"),
    ('mode = "loud"', "[tool.torchdoctor] mode 'loud' is not one of off, explain, strict, fix, warn"),
    ("device = 1", "[tool.torchdoctor] device must be a str, got 1"),
    ("device = [", "is not valid TOML"),
])
def test_bad_config_is_a_usage_error(models: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str,
                                     fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    _pyproject(tmp_path, body)
    monkeypatch.chdir(tmp_path)
    assert main(["scan", f"{models}:fine"]) == 2
    err = capsys.readouterr().err
    assert fragment in err and str(tmp_path / "pyproject.toml") in err and "Traceback" not in err


def test_broken_pipe_keeps_the_exit_code(models: str) -> None:
    # `torchdoctor scan ... --json | head -1`: the reader leaves after one line; the exit code is still 1
    proc = subprocess.Popen([sys.executable, "-m", "torchdoctor", "scan", f"{models}:big", "--dtype", "float32",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"{"
    proc.stdout.close()
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    assert b"Traceback" not in err and b"BrokenPipeError" not in err


def _in_pty(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run with stdout and stderr on a real pseudo-terminal; what the terminal showed."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "torchdoctor", *argv], stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    code = proc.wait(timeout=60)
    return code, b"".join(chunks).decode("utf-8", "replace")


def test_terminal_progress_colour_and_quiet(models: str) -> None:
    code, shown = _in_pty(["scan", f"{models}:slow"], ENV)
    assert code == 1
    assert f"loading {models[:40]}" in shown  # the import took over a second: a progress line on stderr
    assert "\x1b[" in shown  # rich colours on a terminal
    code, shown = _in_pty(["scan", "-q", f"{models}:slow"], dict(ENV, NO_COLOR="1"))
    assert code == 1
    assert "loading" not in shown and "\x1b[" not in shown and "1 problem(s)" in shown


def test_pre_commit_hook_scans_many_checkpoints(tmp_path: Path) -> None:
    import yaml

    hooks = yaml.safe_load((Path(__file__).parents[2] / ".pre-commit-hooks.yaml").read_text())
    hook = next(h for h in hooks if h["id"] == "torchdoctor-checkpoints")
    assert hook["entry"].split()[:2] == ["torchdoctor", "scan"] and hook.get("pass_filenames", True)
    import re

    from safetensors.torch import save_file

    good = tmp_path / "good.safetensors"
    save_file({"w": torch.ones(2)}, str(good))
    plain = tmp_path / "plain.pt"
    torch.save({"w": torch.ones(2)}, plain)
    assert re.search(hook["files"], good.name) and re.search(hook["files"], plain.name)
    exe = Path(sys.executable).with_name(hook["entry"].split()[0])
    run = subprocess.run([str(exe), *hook["entry"].split()[1:], str(good), str(plain)], capture_output=True,
                         text=True, env=ENV, timeout=300)
    assert run.returncode == 0, run.stderr
    assert str(good) in run.stdout and str(plain) in run.stdout  # both files were read in one call
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x80\x02cposix\nsystem\nq\x00X\x02\x00\x00\x00idq\x01\x85q\x02Rq\x03.")
    run = subprocess.run([str(exe), *hook["entry"].split()[1:], str(good), str(bad)], capture_output=True,
                         text=True, env=ENV, timeout=300)
    assert run.returncode in (1, 2) and "posix" in run.stdout + run.stderr
