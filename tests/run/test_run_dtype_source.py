"""A KV cache allocated in a dtype the program chose by a device-type rule of its own (karpathy/nanochat PR #795, hunt
B5: ``dtype = torch.bfloat16 if device.type == "cuda" else torch.float32`` in the caller, handed to the cache's
``torch.zeros(..., dtype=dtype)``) on an Apple GPU while the model is bfloat16: the fix is the rule's line, written
as the name the program cast its model with (``dtype = COMPUTE_DTYPE``), a patch after which the program runs clean
in both of its settings -- never ``dtype=torch.bfloat16`` at the factory, which breaks its float32 setting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

APP = '''import os, torch, torch.nn as nn, torch.nn.functional as F

COMPUTE_DTYPE = {"bfloat16": torch.bfloat16, "float32": torch.float32}[os.environ.get("APP_DTYPE", "bfloat16")]
device = torch.device("mps" if torch.backends.mps.is_available() else "cpu")


class Cache:
    def __init__(self, heads, seq, hd, dtype, device):
        self.k = torch.zeros(1, heads, seq, hd, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)


def attend(qkv, x, cache):
    q, k, v = (z.unsqueeze(1) for z in qkv(x).split(16, -1))
    cache.k[:, :, :3], cache.v[:, :, :3] = k, v
    return F.scaled_dot_product_attention(q, cache.k, cache.v)


def generate(qkv):
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cache = Cache(1, 4, 16, dtype=dtype, device=device)
    return attend(qkv, torch.randn(1, 3, 16, device=device, dtype=COMPUTE_DTYPE), cache)


qkv = nn.Linear(16, 48).to(device, dtype=COMPUTE_DTYPE)
print(generate(qkv).shape)
'''


def _run(cwd: Path, dtype: str = "bfloat16") -> str:
    r = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "mps", "app.py"], cwd=cwd,
                       capture_output=True, text=True, timeout=300, env={**os.environ, "APP_DTYPE": dtype})
    return r.stdout + r.stderr


def test_the_dtype_rule_of_the_caller_is_fixed_with_the_models_dtype_name(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(APP)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    out = _run(tmp_path)
    fix = out.split("Fix:", 1)[1]
    assert "# app.py:20 assigns `torch.bfloat16 if device.type == \"cuda\" else torch.float32` as dtype (float32 " \
           "here), the dtype app.py:9 makes its tensor in (dtype=dtype), while the model computes in bfloat16, cast " \
           "with COMPUTE_DTYPE at app.py:25" in fix, out
    assert "dtype=torch.bfloat16, device" not in fix, out  # never a literal at the factory
    patch = fix.split("Patch (git apply):\n", 1)[1]
    diff = "\n".join(line[4:] for line in patch.splitlines() if line.startswith("    ")) + "\n"
    assert "+    dtype = COMPUTE_DTYPE\n" in diff, diff
    (tmp_path / "p.diff").write_text(diff)
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True, timeout=60)
    for dtype in ("bfloat16", "float32"):  # both of the program's settings
        assert "no placement error" in _run(tmp_path, dtype), dtype
