"""Whole programs that save their output and train with a weighted loss (hunt of the twenty-fifth session, round two).

- A vocoder's waveform handed to ``np.asarray`` still on the device, as soundfile and PIL read a tensor
  (F5-TTS#364, ComfyUI#4077): fixed at that line, ``np.asarray(waveform.cpu())``, proven on a cpu copy of what the
  line read; never the read's own record written as a model path (``model['read at app']['py:13']``).
- ``nn.CrossEntropyLoss(weight=weights)`` built with cpu class weights beside a model moved to the device
  (pytorch#122757): the loss module the program holds is moved where it is built (``loss_fn.to(...)``), proven at
  the failing op; never "no line that made them was recorded".
Each patch applies, and the patched program runs clean on the virtual device.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from run.test_run_cli import run, write

SAVE = """
    import wave
    import numpy as np, torch, torch.nn as nn

    class Vocoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 64)

        def forward(self, mel):
            return torch.tanh(self.proj(mel)).flatten(1)

    def save_wav(path, waveform, sr):
        data = np.asarray(waveform)  # like soundfile.write
        pcm = (data * 32767).astype(np.int16)
        with wave.open(path, "wb") as w:
            w.setnchannels(1); w.setsampwidth(2); w.setframerate(sr); w.writeframes(pcm.tobytes())

    voc = Vocoder().to("cuda")
    with torch.inference_mode():
        audio = voc(torch.randn(1, 10, 16, device="cuda"))
    save_wav("out.wav", audio[0], 24000)
"""

LOSS = """
    import torch, torch.nn as nn
    device = "cuda:0"
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 5)).to(device)
    weights = torch.tensor([1.0, 2.0, 1.0, 0.5, 1.0])
    loss_fn = nn.CrossEntropyLoss(weight=weights)
    for step in range(2):
        x = torch.randn(10, 16, device=device)
        labels = torch.randint(0, 5, (10,), device=device)
        loss_fn(model(x), labels).backward()
"""


def _fixed(tmp_path: Path, text: str, want: str) -> None:
    write(tmp_path / "app.py", text)
    report = json.loads(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path).stdout)
    (fix,) = report["fixes"]
    assert want in fix["code"] and fix["proven"], fix
    assert "model[" not in fix["code"] and "no line that made them was recorded" not in fix["code"], fix
    subprocess.run(["git", "apply", "-"], input=report["patch"], cwd=tmp_path, text=True, check=True, timeout=60)
    assert json.loads(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path).stdout)["ok"]


def test_a_waveform_handed_to_numpy_on_the_device_is_read_to_the_cpu_at_that_line(tmp_path: Path) -> None:
    _fixed(tmp_path, SAVE, "np.asarray(waveform.cpu())")


def test_a_weighted_losss_cpu_class_weights_move_with_the_loss_module(tmp_path: Path) -> None:
    _fixed(tmp_path, LOSS, "loss_fn.to(device)")  # (the program's name for its device)
