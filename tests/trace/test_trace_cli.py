"""``torchdoctor trace SCRIPT ARGS...``: an unmodified script is traced; its exit code is kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from torch import nn

from torchdoctor._cli.main import main
from torchdoctor._trace.patches import patched

APP = """\
import sys
import torch
from torch import nn

model = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))
model.half()
model[0].bias.data = model[0].bias.data.float()
print("argv", sys.argv[1:])
if sys.argv[1:] == ["boom"]:
    raise ValueError("the script failed")
sys.exit(int(sys.argv[1]) if sys.argv[1:] else 0)
"""


@pytest.fixture()
def app(tmp_path: Path) -> Path:
    path = tmp_path / "app.py"
    path.write_text(APP)
    return path


def _docs(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_traces_an_unmodified_script_keeps_its_exit_code_and_argv(app: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "moves.jsonl"
    before = nn.Module.__dict__["to"]
    assert main(["trace", "--file", str(out), str(app), "3"]) == 3
    captured = capsys.readouterr()
    assert "argv ['3']" in captured.out
    assert "torchdoctor trace: [Sequential] 0.weight: float32@cpu -> float16@cpu by Sequential.half() at " in captured.err
    assert "torchdoctor trace: 5 change(s) shown, 5 recorded" in captured.err
    docs = _docs(out)
    assert [(d["path"], d["call"], d["line"], d["root"]) for d in docs] == [
        ("0.weight", "half()", 6, "Sequential"), ("0.bias", "half()", 6, "Sequential"),
        ("1.weight", "half()", 6, "Sequential"), ("1.bias", "half()", 6, "Sequential"),
        ("0.bias", ".data =", 7, "Sequential")]
    assert {d["file"] for d in docs} == {str(app)}
    assert nn.Module.__dict__["to"] is before and patched() == []


def test_script_errors_exit_1_with_the_scripts_traceback(app: Path, capsys) -> None:
    assert main(["trace", str(app), "boom"]) == 1
    err = capsys.readouterr().err
    assert "ValueError: the script failed" in err and f'File "{app}", line 10' in err
    assert "runpy" not in err  # the traceback starts at the script
    assert patched() == []


def test_a_missing_script_is_exit_2_with_one_line(tmp_path: Path, capsys) -> None:
    assert main(["trace", str(tmp_path / "nope.py"), "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope.py' does not exist" in err[0]


def test_environment_variable_selects_what_is_shown(app: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    out = tmp_path / "x.jsonl"
    monkeypatch.setenv("TORCHDOCTOR_TRACE", "lora")
    assert main(["trace", "--file", str(out), str(app)]) == 0
    assert out.read_text() == "" and "0 change(s) shown, 5 recorded" in capsys.readouterr().err
    assert main(["trace", "--moves", "--file", str(out), str(app)]) == 0  # flags win over the variable
    assert len(_docs(out)) == 5
    monkeypatch.setenv("TORCHDOCTOR_TRACE", "moves,sizes")
    assert main(["trace", str(app)]) == 2
    assert "TORCHDOCTOR_TRACE='moves,sizes': unknown word 'sizes'; use moves, lora or moves,lora" in \
        capsys.readouterr().err


def test_unwritable_output_file_is_exit_2(app: Path, tmp_path: Path, capsys) -> None:
    assert main(["trace", "--file", str(tmp_path / "no" / "dir" / "x.jsonl"), str(app)]) == 2
    assert "cannot write --file" in capsys.readouterr().err


PEFT_APP = """\
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from peft import LoraConfig, get_peft_model

cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
model.add_adapter("b", LoraConfig(r=2, target_modules=["v_proj"]))
model.delete_adapter("default")
"""


def test_subprocess_script_importing_peft_after_the_trace_started(tmp_path: Path) -> None:
    """The libraries are imported by the script, after the trace began: their entry points are still patched."""
    script = tmp_path / "lora_app.py"
    script.write_text(PEFT_APP)
    out = tmp_path / "lora.jsonl"
    env = {**os.environ, "TORCHDOCTOR_TRACE": "moves,lora", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "trace", "--file", str(out), str(script)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    docs = _docs(out)
    calls = {(d["call"], d["kind"], d["line"]) for d in docs}
    assert ("to()", "move", 7) in calls
    assert ("add_adapter()", "add", 9) in calls and ("delete_adapter()", "remove", 10) in calls
    added = {d["path"] for d in docs if d["call"] == "add_adapter()"}
    assert added and all(".v_proj.lora_" in p and p.endswith(".b.weight") for p in added)


def test_a_logging_dictconfig_before_the_trace_does_not_mute_its_lines(app: Path, capsys) -> None:
    import logging
    import logging.config

    from support import state

    logging.getLogger("torchdoctor.trace")  # exists before the app configures logging, as in a long test session
    saved = state.snapshot()
    logging.config.dictConfig({"version": 1})  # disable_existing_loggers=True by default: disables it
    try:
        assert logging.getLogger("torchdoctor.trace").disabled  # the state the trace meets
        assert main(["trace", str(app), "3"]) == 3
        assert "torchdoctor trace: [Sequential] 0.weight: float32@cpu -> float16@cpu by Sequential.half() at " \
            in capsys.readouterr().err
    finally:  # dictConfig disabled every logger there is (diffusers' too): a later test reads them
        state.restore(saved)
