"""A factory fix at the user's line replaces the ``device=`` the call passed (``device="cuda"``, the current device, on
a cuda:1 run: mistral-inference#215) instead of appending a second move after it, and the patch applied runs clean;
a tensor a library call made at the user's line (``torch.load(..., map_location="cpu")``) is never advised a
``device=`` for a factory that line does not call (issue 41 point 1, hunt U7, U2)."""

from __future__ import annotations

import importlib.util
import subprocess
import textwrap
from pathlib import Path
from types import ModuleType

import torchdoctor

MASK = """
    import torch, torch.nn as nn, torch.nn.functional as F
    class Attn(nn.Module):
        def __init__(self):
            super().__init__(); self.q = nn.Linear(4, 4)
        def forward(self, x):
            mask = torch.zeros(3, 3, device="cuda")
            q = self.q(x)
            return F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    def build(): return Attn()
    def app(m, device="cuda:1"):
        m.to(device)
        return m(torch.randn(1, 3, 4, device=device))
"""

LOADED = """
    import io, torch, torch.nn as nn
    def build(): return nn.Linear(4, 4)
    def app(m, device="cuda:0"):
        m.to(device)
        buf = io.BytesIO(); torch.save({"s": torch.ones(4)}, buf); buf.seek(0)
        state = torch.load(buf, map_location="cpu")
        return m(torch.randn(1, 4, device=device)) * state["s"]
"""


def _load(path: Path, text: str) -> ModuleType:
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"_h1_kw_{path.stem}_{path.stat().st_mtime_ns}", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_device_the_call_passed_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "mask.py"
    mod = _load(path, MASK)
    api = torchdoctor.simulate(mod.build(), device="cuda:1", call=mod.app)
    (fix,) = api.to_dict()["fixes"]
    assert fix["proven"] and fix.get("diff"), fix
    assert '+        mask = torch.zeros(3, 3, device=x.device)\n' in fix["diff"] and ".to(" not in fix["diff"], fix["diff"]
    proc = subprocess.run(["git", "apply", "--unsafe-paths", "-p1", "--directory", "."], input=fix["diff"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    fixed = _load(path, path.read_text(encoding="utf-8"))
    assert torchdoctor.simulate(fixed.build(), device="cuda:1", call=fixed.app).ok


def test_a_tensor_torch_load_made_is_fixed_at_its_map_location(tmp_path: Path) -> None:
    mod = _load(tmp_path / "loaded.py", LOADED)
    api = torchdoctor.simulate(mod.build(), device="cuda:0", call=mod.app)
    assert not api.ok
    (fix,) = api.fixes  # the load at the program's line made it (never torch.empty inside it): its map_location
    assert "state['s'] (loaded by torch.load at " in api.problems[0].message and "torch.empty" not in api.text()
    assert fix.code.startswith("state = torch.load(buf, map_location='cuda:0')  # the load put what it read where "
                               "map_location='cpu' says"), api.text()
    assert "device=" not in fix.code and fix.diff is not None and fix.proven
    assert "a virtual re-run with the line changed: no problem left" in fix.tried, fix.tried
