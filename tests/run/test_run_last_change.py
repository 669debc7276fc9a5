"""torchdoctor run --device: the "last change" of a problem's tensor is that object's record, not the record of
another object that has a tensor at the same path."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

CLASS = textwrap.dedent('''
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(4, 4); s.scale = torch.ones(4)
        def forward(s, x): return s.l(x) * s.scale
''')
OTHER = 'm = nn.Linear(4, 4).to("cuda:1")\nm.scale = torch.ones(4)\n'
MODEL = 'mm = M().to("cuda:1")\n'
CALL = 'print(mm(torch.ones(1, 4, device="cuda:1")).shape)\n'


@pytest.mark.parametrize("other_first", [True, False])
def test_last_change_is_the_objects_own(tmp_path, other_first):
    head = "import torch\nfrom torch import nn\n"
    body = (OTHER + CLASS + MODEL) if other_first else (CLASS + MODEL + OTHER)
    src = head + body + CALL
    (tmp_path / "app.py").write_text(src)
    lines = src.splitlines()
    own = next(i for i, ln in enumerate(lines, 1) if "s.scale = torch.ones" in ln)
    other = next(i for i, ln in enumerate(lines, 1) if ln.startswith("m.scale ="))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda:1", "app.py"],
                       capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    assert "torch.Size([1, 4])" in p.stdout
    assert f"last change: float32 on cpu created by `.scale =` at app.py:{own}" in p.stderr
    assert f"app.py:{other}" not in p.stderr
