"""torchdoctor run: an error the program catches and prints or logs as text is found in every --mode, with guard's
culprit, its fix and proof label; fix / warn list what guard aligned; exit 1 when anything was found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

APP = textwrap.dedent('''
    import logging, sys, traceback, torch, torch.nn as nn
    class VisionTower(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = nn.Conv2d(3, 8, 2, stride=2)
            self.norm = nn.LayerNorm(8)
        def forward(self, images):
            return self.norm(self.patch(images).flatten(2).transpose(1, 2))
    class Node:
        def __init__(self):
            self.model = VisionTower().to(torch.bfloat16)
            self.model.patch.bias.data = self.model.patch.bias.data.float()
        def process(self, images):
            return self.model(images.to(torch.bfloat16))
    def execute():
        try:
            Node().process(torch.rand(1, 3, 8, 8))
        except Exception as e:
            REPORT
    execute()
    print("prompt executed")
''')
LOGGED = 'logging.error(f"!!! Exception during processing !!! {e}"); logging.error(traceback.format_exc())'
PRINTED = 'print("!!! Exception during processing !!!", e); traceback.print_exc()'
STDERR = 'print("!!! Exception during processing !!!", e, file=sys.stderr); traceback.print_exception(e)'


def _run(tmp_path, report: str, *args: str) -> tuple[int, str, str]:
    script = tmp_path / "app.py"
    script.write_text(APP.replace("REPORT", report))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    p = subprocess.run([sys.executable, "-m", "torchdoctor", "run", *args, str(script)], capture_output=True,
                       text=True, timeout=240, env=env, cwd=tmp_path)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("mode", ["explain", "strict", "warn", "fix"])
def test_logged_error_found_in_every_mode(tmp_path, mode):
    code, out, err = _run(tmp_path, LOGGED, "--mode", mode)
    assert code == 1, err
    assert "prompt executed" in out
    summary = err[err.index("torchdoctor run:"):]
    assert "1 placement error(s) met" in summary
    assert "patch.bias" in summary
    assert "model.patch.bias.data = model.patch.bias.data.to(torch.bfloat16)" in summary
    assert "fix proven" in summary
    assert "x = x.to(" not in summary and "layer.to(" not in summary
    if mode in ("fix", "warn"):
        assert f"aligned by --mode {mode} at app.py:9 in forward: " in summary  # the line guard recorded it at
        assert "make the fix permanent" in summary
        assert "since `.data =` at" in summary and "app.py:13" in summary


@pytest.mark.parametrize("report", [PRINTED, STDERR])
def test_caught_and_printed_error_found(tmp_path, report):
    code, out, err = _run(tmp_path, report)
    assert code == 1, err
    assert "prompt executed" in out
    # the program's own output is unchanged: its traceback is printed once
    assert err.count("Traceback (most recent call last)") == 1
    summary = err[err.index("torchdoctor run:"):]
    assert "caught and printed at app.py:9 in forward" in summary
    assert "culprit patch.bias" in summary
    assert "model.patch.bias.data = model.patch.bias.data.to(torch.bfloat16)" in summary


def test_fix_mode_json_lists_the_aligned_fix(tmp_path):
    code, out, err = _run(tmp_path, LOGGED, "--mode", "fix", "--json")
    assert code == 1, err
    data = json.loads(out[out.index("{"):])
    assert data["exit_code"] == 0 and not data["ok"]
    (f,) = data["findings"]
    assert f["how"] == "aligned by --mode fix" and f["where"] == "app.py:9 in forward"
    assert "patch.bias" in f["culprit"] and f["fix"].startswith("model.patch.bias.data")


def test_clean_program_in_fix_mode_is_ok(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "APP", APP.replace(".float()", ".to(torch.bfloat16)"))
    code, out, err = _run(tmp_path, LOGGED, "--mode", "fix")
    assert code == 0, err
    assert "prompt executed" in out and err.strip().endswith("no placement error")


TWO_MODELS = textwrap.dedent('''
    import logging, traceback, types, torch, torch.nn as nn
    class AnyText(nn.Module):
        def __init__(self):
            super().__init__(); self.enc = nn.Linear(8, 8); self.dec = nn.Linear(8, 8)
        def forward(self, x):
            h = self.enc(x)
            h = h.float()
            return self.dec(h)
    class Block(nn.Module):
        def __init__(self):
            super().__init__(); self.lin = nn.Linear(8, 8)
            self.config = types.SimpleNamespace(compute_dtype=torch.float32)
        def forward(self, x):
            return self.lin(x).to(self.config.compute_dtype)
    class Net(nn.Module):
        def __init__(self):
            super().__init__(); self.block = Block(); self.head = nn.Linear(8, 8)
        def forward(self, x): return self.head(self.block(x))
    for build in (AnyText, Net):
        try:
            build().to(torch.float16)(torch.randn(2, 8, dtype=torch.float16))
        except Exception as e:
            logging.error("!!! Exception during processing !!! %s", e); logging.error(traceback.format_exc())
''')


def test_second_caught_error_named_in_its_own_model(tmp_path):
    """Two nodes' errors with one message, each caught and logged: the second is named in its own model (the first
    one's forwards, left on guard's stack when its error escaped, are not its root), with its config fix."""
    (tmp_path / "app.py").write_text(TWO_MODELS)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    p = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--color", "never", "app.py"],
                       capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    summary = p.stderr[p.stderr.index("torchdoctor run:"):]
    assert "2 placement error(s) met" in summary
    second = summary[summary.index("app.py:19 in forward"):]
    assert "outside the guarded model" not in second
    assert "dtype mismatch in `head` (Linear)" in second
    assert "model.block.config.compute_dtype = torch.float16" in second
    assert "<self.config" not in second


def test_explains_fix_speaks_of_the_tensor_by_the_users_name():
    from torchdoctor._run.evidence import named_fix

    culprit = ("unsupported_dtype mismatch outside the guarded model, at save.py:11\n"
               "    line: arr = (255.0 * images.cpu().numpy()).clip(0, 255)\n"
               "    images: bf16[1,2,2,3]@cuda:0\n    original error: TypeError: Got unsupported ScalarType BFloat16")
    assert named_fix("arr = t.detach().float().cpu().numpy()", culprit) == \
        "arr = images.detach().float().cpu().numpy()"
    # two tensors on the line, or none named: explain's fix as it is
    two = culprit.replace("    images:", "    masks: f32[2]@cpu\n    images:").replace("images.cpu()", "images.cpu() * masks")
    assert named_fix("arr = t.detach().float().cpu().numpy()", two) == "arr = t.detach().float().cpu().numpy()"
    assert named_fix("arr = t.detach().float().cpu().numpy()", None) == "arr = t.detach().float().cpu().numpy()"


def test_run_names_the_numpy_tensor_of_a_bf16_save(tmp_path):
    (tmp_path / "app.py").write_text(textwrap.dedent('''
        import numpy as np, torch
        def save(images):
            arr = (255.0 * images.cpu().numpy()).clip(0, 255)
            return arr
        save(torch.rand(1, 2, 2, 3).to(torch.bfloat16))
    '''))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    p = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--color", "never", "app.py"],
                       capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    summary = p.stderr[p.stderr.index("torchdoctor run:"):]
    assert "Got unsupported ScalarType BFloat16" in summary
    assert "images" in summary.split("fix:", 1)[1] and "= t." not in summary
