"""A module traced on the CPU with ``torch.jit.trace`` and moved to the GPU afterwards (a plain-attribute table the
tracer bakes into the code as a constant, as a relative-position attention does): the trace's example input
is never patched as if it were the program's data (moving it would break the trace on real hardware), never called
proven, and no fix moves a table after tracing (the traced code keeps its constants) or names a TorchScript
constant by a path code cannot reach (issue 41 point 1, hunt T9)."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import torchdoctor

PROGRAM = """
    import torch, torch.nn as nn
    class Rel(nn.Module):
        def __init__(self):
            super().__init__(); self.q = nn.Linear(4, 4); self.table = torch.randn(9, 4)
        def forward(self, x):
            idx = torch.arange(x.shape[1], device=x.device)
            pe = torch.embedding(self.table, idx)
            return self.q(x) + pe.to(x.dtype)
    def build(): return Rel()
    def app(m, device="cuda:0"):
        traced = torch.jit.trace(m.eval(), (torch.randn(1, 5, 4),), check_trace=False)
        traced = traced.to(device)
        return traced(torch.randn(1, 5, 4, device=device))
"""


def test_the_trace_example_input_is_advice_never_a_patch(tmp_path: Path) -> None:
    path = tmp_path / "traced.py"
    path.write_text(textwrap.dedent(PROGRAM), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("_h1_traced", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    api = torchdoctor.simulate(mod.build(), device="cuda:0", call=mod.app)
    assert not api.ok
    fixes = api.to_dict()["fixes"]
    assert not any(f.get("diff") and "jit.trace" in f["diff"] for f in fixes), fixes
    assert "<constant>" not in "\n".join(f["code"] for f in fixes), fixes
    assert not any(".data = " in f["code"] for f in fixes), fixes  # a move after tracing never reaches a constant
    traced = [f for f in fixes if "made the example input torch.jit.trace recorded" in f["code"]]
    assert traced and all(not f["proven"] for f in traced), fixes
