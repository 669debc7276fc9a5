"""``torchdoctor run --device xpu`` of a program whose layer streamer hard-codes ``torch.cuda.Stream()`` (hunt Z11,
an Intel Arc card): one no_accelerator finding at the program's line, no tensor named as its culprit, and the fix is
the device-generic streams and events; the program written with them runs clean on the same virtual xpu."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

APP = '''import torch, torch.nn as nn

class Streamer:
    def __init__(self, device):
        self.device = device
        self.copy = {stream}
        self.ready = {event}

    def run(self, block, x):
        with {enter}:
            block.to(self.device, non_blocking=True)
            self.ready.record(self.copy)
        {current}.wait_event(self.ready)
        return block(x)

device = torch.device("xpu")
print(Streamer(device).run(nn.Linear(4, 4), torch.ones(2, 4, device=device)).device)
'''
CUDA = dict(stream="torch.cuda.Stream()", event="torch.cuda.Event()", enter="torch.cuda.stream(self.copy)",
            current="torch.cuda.current_stream()")
GENERIC = dict(stream="torch.Stream(device=device)", event="torch.Event(device=device)", enter="self.copy",
               current="torch.accelerator.current_stream()")


def _run(tmp_path: Path, name: str, parts: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / name).write_text(APP.format(**parts))
    return subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "xpu", name], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)


def test_a_cuda_only_stream_on_an_xpu_run_is_fixed_with_the_generic_api(tmp_path: Path) -> None:
    proc = _run(tmp_path, "app.py", CUDA)
    assert proc.returncode == 1
    assert "[no_accelerator] RuntimeError: torch.cuda.Stream requires CUDA support" in proc.stderr, proc.stderr
    assert "raised at app.py:6 in __init__: A CUDA-only API on a torch without CUDA" in proc.stderr
    assert "stream = torch.Stream(device=device)  # was torch.cuda.Stream()" in proc.stderr
    assert "outside the guarded model" not in proc.stderr and "current_accelerator" not in proc.stderr
    fixed = _run(tmp_path, "fixed.py", GENERIC)  # the fix's API on the same virtual device: runs clean
    assert fixed.returncode == 0 and "xpu:0" in fixed.stdout and "no placement error" in fixed.stderr, fixed.stderr
