"""A forward's line where the model's data is promoted by a tensor a cast made wider on purpose (a rope computing
its angles in float32 applied to float16 q/k: SDPA then meets float32 q/k and float16 v; LongCat-Image #21's MPS-safe
rope): the fix is that line's value cast back to the data's dtype (``.to(x.dtype)``), as a patch, proven at the
failing op; never the positions cast to float16 (the float32 frequencies promote them back). The same in
``simulate``, and for another shape: an assignment in a forward (``h = h * scale`` with ``scale = emb.float()...``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import torch

import torchdoctor
from run.test_run_cli import run, write

ROPE = """
    import torch, torch.nn as nn


    def rope(pos, dim):
        freqs = torch.arange(0, dim, 2, device=pos.device, dtype=torch.float32) / dim
        angles = torch.outer(pos.to(torch.float32), freqs)
        return angles.cos(), angles.sin()


    def apply_rope(x, cos, sin):
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


    class Attn(nn.Module):
        def __init__(self, d=16):
            super().__init__()
            self.qkv = nn.Linear(d, 3 * d)

        def forward(self, x):
            cos, sin = rope(torch.arange(x.shape[1], device=x.device), x.shape[-1])
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            return nn.functional.scaled_dot_product_attention(q, k, v)


    if __name__ == "__main__":
        dev = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
        dt = torch.float16 if dev != "cpu" else torch.float32
        model = Attn().to(dev, dt).eval()
        with torch.no_grad():
            print("shape", tuple(model(torch.randn(1, 6, 16, device=dev, dtype=dt)).shape))
"""
LINE = "return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)"


def test_run_casts_the_promoting_line_back_and_the_patched_program_runs_clean(tmp_path: Path) -> None:
    write(tmp_path / "rope.py", ROPE)
    proc = run("--device", "mps", "rope.py", cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert "aten.mul at rope.py:13, where x (float16) meets a float32 tensor made by " in out, out
    fix = out[out.index("\nFix"):]
    assert f"# rope.py:13: `{LINE}` promotes x (float16) to float32 with a tensor the cast at rope.py:7 made " \
           "float32: cast the line's value back to x.dtype there" in fix, out
    assert "# fix proven" in fix and "pos.to(torch.float16)" not in fix, out
    diff = out.split("Patch (git apply):\n", 1)[1]
    diff = "\n".join(line[4:] for line in diff.splitlines() if line.startswith("    ")) + "\n"
    assert f"+    {LINE}.to(x.dtype)" in diff, diff
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "p.diff").write_text(diff)
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True, timeout=60)
    again = run("--device", "mps", "rope.py", cwd=tmp_path)
    said = again.stdout + again.stderr
    assert "no placement error" in said and "shape (1, 6, 16)" in said, said


MODULATED = """
    import torch, torch.nn as nn


    class Mod(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.out = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x, emb):
            h = self.lin(x)
            scale = emb.float().sigmoid()
            h = h * scale
            return self.out(h)
"""


def test_simulate_fixes_a_promoting_assignment_where_it_is_assigned(tmp_path: Path) -> None:
    path = write(tmp_path / "modulated.py", MODULATED)
    spec = importlib.util.spec_from_file_location("modulated_h1", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["modulated_h1"] = mod
    try:
        spec.loader.exec_module(mod)
        report = torchdoctor.simulate(mod.Mod(), (torch.randn(2, 8), torch.randn(2, 8)), "cuda", dtype=torch.bfloat16)
    finally:
        sys.modules.pop("modulated_h1", None)
    assert report.fix is not None and "`h = h * scale` promotes x (bfloat16) to float32" in report.fix, report
    assert "+        h = (h * scale).to(x.dtype)" in str(report), report
    assert "fix proven" in str(report), report
