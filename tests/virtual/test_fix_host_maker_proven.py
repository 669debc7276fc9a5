"""A tensor made from host data (``torch.from_numpy``, which no function mode sees) in the wrong dtype is fixed at
its line (``.to(torch.float16)`` after the call, a diff) and proven by a re-run where that call at that line is
followed by the fix's cast, never "advice only" (hunt s15 V9: ComfyUI#12808, a float32 waveform fed to a float16
Wav2Vec2); torch's own function is put back after the re-run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import torch

import torchdoctor
from support.apps import load_file as _load

APP = """
    import numpy as np
    import torch

    from transformers import Wav2Vec2Config, Wav2Vec2Model

    def build():
        return Wav2Vec2Model(Wav2Vec2Config(
            hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, conv_dim=(8, 8),
            conv_stride=(5, 2), conv_kernel=(10, 3), conv_bias=True, num_conv_pos_embeddings=4,
            num_conv_pos_embedding_groups=2, vocab_size=8)).eval()

    def app(m, device="cuda:0"):
        m.to(device, torch.float16)
        wav = torch.from_numpy(np.random.randn(2, 1600).astype(np.float32))
        x = wav.mean(0, keepdim=True)
        x = ((x - x.mean()) / (x.std() + 1e-7)).to(device)  # normalised on the cpu, moved, never cast
        with torch.no_grad():
            return m(x).last_hidden_state
"""



def test_a_from_numpy_fix_is_proven_by_a_re_run_and_its_diff_works(tmp_path: Path) -> None:
    path = tmp_path / "wave_app.py"
    path.write_text(textwrap.dedent(APP), encoding="utf-8")
    mod = _load(path, "_td_wave_app")
    before = torch.from_numpy
    report = torchdoctor.simulate(mod.build(), device="cuda:0", call=mod.app)  # type: ignore[attr-defined]
    assert torch.from_numpy is before
    [fix] = report.fixes
    assert "torch.from_numpy made it in float32" in fix.code and fix.proven, report.text()
    # proven by a re-run; at the op too, where the conv reads a view of the argument the line makes
    assert fix.tried == "applied in a virtual re-run: no problem left" or fix.tried.startswith(
        "at the failing op aten.conv1d.default") and "; the cast of input 0 (input_values) carried through " \
        "aten.unsqueeze to the operand; a virtual re-run with the line changed: no problem left" in fix.tried, fix.tried
    assert fix.diff is not None
    proc = subprocess.run(["git", "apply", "--unsafe-paths", "-p1", "--directory", "."], input=fix.diff,
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    again = _load(path, "_td_wave_app_fixed")
    assert torchdoctor.simulate(again.build(), device="cuda:0", call=again.app).ok  # type: ignore[attr-defined]
    sys.modules.pop("_td_wave_app", None)
    sys.modules.pop("_td_wave_app_fixed", None)
