"""``torchdoctor simulate app.py:build`` of a Llama built on meta costs what ``torchdoctor.simulate`` costs
(issue 42 point 9): the command line keeps no values for the virtual tensors unless asked (``--data cpu``), as the
API does, so weights that were never loaded are never materialised as zeros (an 8-layer Llama of a 7B width took
7.5 GB and a minute that way; the 80-layer 70B shape never finished)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import torchdoctor
from torchdoctor._cli.main import main
from support.apps import app_folder

ENV = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", COLUMNS="200")
HANG_GUARD = 420  # seconds: a cold child on a loaded 2-core runner imports torch, transformers and bitsandbytes

APP = textwrap.dedent(
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    def _build(hidden, inter, vocab, heads):
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=8,
                          num_attention_heads=heads, num_key_value_heads=heads)
        with torch.device("meta"):  # weights never loaded: 7.5 GB in float32 for the 7B width
            return LlamaForCausalLM(cfg)

    def tiny():
        return _build(64, 128, 256, 4)

    def wide():
        return _build(4096, 11008, 32000, 32)
    """
)


@pytest.fixture()
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return app_folder(tmp_path, monkeypatch, "llamaapp.py", APP)


def _child_peak_mib(argv: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """The command as a user runs it (parent and TARGET child), under the hang guard; the largest resident set of
    the processes it started, in MiB (Linux reports KiB)."""
    code = ("import resource, subprocess, sys; "
            "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
            "sys.stdout.write(p.stdout); sys.stderr.write(p.stderr); "
            "print('PEAK', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
            "sys.exit(p.returncode)")
    proc = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "torchdoctor", *argv], cwd=cwd,
                          env=ENV, capture_output=True, text=True, timeout=HANG_GUARD)
    peak = next(int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("PEAK "))
    return proc, peak / 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss in KiB is Linux's")
def test_cli_simulate_of_a_meta_built_7b_width_llama_finishes_without_materialising_it(app: Path) -> None:
    proc, peak = _child_peak_mib(["simulate", "llamaapp.py:wide", "--device", "cuda:1", "--json", "-q"], app)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] and doc["data"] == "meta"
    assert doc["assumed"].startswith("weights not loaded: assumed on cuda:1 (all 75 parameters are on meta")
    # the weights alone are 7.5 GB in float32: a process far below that never made them
    assert peak < 2048, f"peak resident set {peak:.0f} MiB"


def test_cli_and_api_agree_on_a_meta_built_llama(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import llamaapp  # type: ignore[import-not-found]

    api = torchdoctor.simulate(llamaapp.tiny(), device="cuda:1", dtype="bfloat16")
    assert main(["simulate", "llamaapp.py:tiny", "--device", "cuda:1", "--dtype", "bfloat16", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["data"] == api.data == "meta"
    assert doc["ok"] is api.ok is True and doc["assumed"] == api.assumed
    assert [(g["device"], g["dtype"], g["tensors"]) for g in doc["summary"]] == \
        [(g["device"], g["dtype"], g["tensors"]) for g in api.summary]


def test_data_cpu_keeps_values_when_asked(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "llamaapp.py:tiny", "--device", "cuda:1", "--data", "cpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["data"] == "cpu"
    assert main(["simulate", "llamaapp.py:tiny", "--device", "cuda:1", "--data", "gpu"]) == 2
    assert "argument --data: invalid choice: 'gpu'" in capsys.readouterr().err
