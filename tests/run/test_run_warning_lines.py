"""Under ``torchdoctor run --device``, a torch warning is shown at the program's line as without torchdoctor — a C++
warning (``torch.tensor(t)``'s copy advice) and one with a stack level (``F.softmax`` without ``dim``) — while run
also watches what is displayed (a disabled autocast is a finding): two showwarning wrappers, one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

APP = '''import torch, torch.nn as nn
x = torch.randn(4, 4, device="cuda")
y = torch.tensor(x)
m = nn.Linear(4, 4).to("cuda")
out = nn.functional.softmax(m(x))
print("done")
'''


def test_warnings_are_shown_at_the_programs_lines(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(APP)
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", "app.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "app.py:3: UserWarning: To copy construct from a tensor" in out, out
    assert "app.py:5: UserWarning: Implicit dimension choice for softmax" in out, out
    assert "runpy" not in out and "torchdoctor/" not in out
