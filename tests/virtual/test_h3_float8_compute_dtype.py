"""A LoRA merged into a float8-stored weight at the weight's own dtype (sd-webui-forge-classic #1288, hunt A6): the
merge's mm has no float8 kernel on a GPU, and its operands are cast to float8 by ``.to(w.device,
computation_dtype)`` where the caller passed ``computation_dtype=weight.dtype``. The fix is at that caller's line
(a diff: bfloat16 when the dtype read is a one-byte storage dtype), proven at the failing op; the patched program runs
clean; float8 is never a cast target. A dtype bound by a one-line assignment in the function is fixed there; a
float32 compute dtype (ComfyUI's rule) is quiet."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import torchdoctor

MERGE = """\
    import torch, torch.nn as nn

    class CastLinear(nn.Linear):  # float8 storage, cast to the input's dtype per call
        weight_function = ()
        def forward(self, x):
            w = self.weight
            for f in self.weight_function:
                w = f(w)
            return nn.functional.linear(x, w.to(x.dtype), self.bias.to(x.dtype))

    def merge(patch, weight, computation_dtype):
        up, down = patch
        w = weight.to(computation_dtype)
        w = w + 0.5 * (up.to(w.device, computation_dtype) @ down.to(w.device, computation_dtype))
        return w.to(weight.dtype)

    class Patch:
        def __init__(self, patch):
            self.patch = patch
        def __call__(self, weight):
            return merge(self.patch, weight, {dtype})

    model = nn.Sequential(CastLinear(16, 16), nn.GELU(), CastLinear(16, 4)).to("cuda")
    for m in model:
        if isinstance(m, CastLinear):
            m.weight.data = m.weight.data.to(torch.float8_e4m3fn)  # an fp8 checkpoint
    model[0].weight_function = (Patch((torch.randn(16, 4) * 0.1, torch.randn(4, 16) * 0.1)),)
    with torch.no_grad():
        print(model(torch.randn(2, 16, device="cuda", dtype=torch.bfloat16)).float().sum().item())
"""


def _run(cwd: Path) -> str:
    r = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", "app.py"], cwd=cwd,
                       capture_output=True, text=True, timeout=300)
    return r.stdout + r.stderr


def test_run_fixes_the_compute_dtype_where_the_caller_passes_it(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(textwrap.dedent(MERGE.format(dtype="computation_dtype=weight.dtype")))
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    out = _run(tmp_path)
    fix = out.split("Fix:", 1)[1]
    assert "# app.py:21 passes merge() `weight.dtype` (float8_e4m3fn, a storage dtype) as computation_dtype, the " \
           "dtype `w = w + 0.5 * (up.to(w.device, computation_dtype) @ down.to(w.device, computation_dtype))` at " \
           "app.py:14 casts the mm's operands to; cuda has no mm kernel in float8_e4m3fn" in fix, out
    assert "# fix proven (at the failing op aten.mm.default at app.py:14" in fix, out
    assert "not on record" not in fix and "float8_e4m3fn)" not in fix, out  # never a cast to float8
    patch = fix.split("Patch (git apply):\n", 1)[1]
    diff = "\n".join(line[4:] for line in patch.splitlines() if line.startswith("    ")) + "\n"
    assert "+        return merge(self.patch, weight, computation_dtype=torch.bfloat16 if weight.dtype.itemsize " \
           "== 1 else weight.dtype)\n" in diff, diff
    (tmp_path / "p.diff").write_text(diff)
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True, timeout=60)
    assert "no placement error" in _run(tmp_path)


def test_a_float32_compute_dtype_is_quiet(tmp_path: Path) -> None:
    rule = "torch.float32 if weight.dtype not in (torch.float32, torch.float16, torch.bfloat16) else weight.dtype"
    (tmp_path / "app.py").write_text(textwrap.dedent(MERGE.format(dtype=rule)))
    assert "no placement error" in _run(tmp_path)


class Stored(nn.Module):
    """A layer that keeps its weight in float8 and merges a delta at a dtype it binds from the weight."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 8).to(torch.float8_e4m3fn), requires_grad=False)
        self.up, self.down = nn.Parameter(torch.randn(8, 2)), nn.Parameter(torch.randn(2, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = self.weight.dtype
        delta = self.up.to(dt) @ self.down.to(dt)
        return x @ (self.weight.to(torch.float32) + delta.to(torch.float32))


@pytest.mark.parametrize("device", ["cuda", "xpu"])
def test_simulate_fixes_a_dtype_bound_in_the_forward(device: str) -> None:
    r = torchdoctor.simulate(Stored(), torch.randn(2, 8), device=device)
    assert not r.ok
    fix = next(f for f in r.fixes if "storage dtype" in f.code)
    assert "test_h3_float8_compute_dtype.py:" in fix.code and " assigns `self.weight.dtype` (float8_e4m3fn, a " \
        "storage dtype) as dt, the dtype `delta = self.up.to(dt) @ self.down.to(dt)`" in fix.code, fix.code
    assert fix.proven, fix.tried
    assert fix.diff is not None and "+        dt = torch.bfloat16 if self.weight.dtype.itemsize == 1 else " \
        "self.weight.dtype\n" in fix.diff, fix.diff
