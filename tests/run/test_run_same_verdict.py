"""One case, one fix and one verdict on every verb: ``torchdoctor run --device`` (a whole program on virtual devices,
its fix proven at the failing op) and the block the pytest marker runs print the code ``simulate(model, call=app)``
prints for the same program, and never call a fix proven that simulate's re-run could not prove (hunt RN1).

The programs re-create the reports' mechanisms in a few lines: a pipeline wrapper that loads its ControlNet apart
from the model on the CPU and never moves it (modl-org/modl#122), a text encoder left in float32 in a bfloat16
pipeline whose output meets the transformer's query in SDPA (vladmandic/sdnext#3470), a float16 text encoder in a
bfloat16 pipeline under accelerate's CPU offload hooks (huggingface/diffusers#11436).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import torchdoctor
from run.test_run_cli import run, write
from support.apps import load_file as _load

HELD_APART = """
    import torch, torch.nn as nn
    class CN(nn.Module):
        def __init__(self):
            super().__init__(); self.enc = nn.Linear(8, 8)
        def forward(self, hint): return self.enc(hint)
    class ZImage(nn.Module):
        def __init__(self):
            super().__init__(); self.x_in = nn.Linear(8, 8); self.control_proj = nn.Linear(8, 8)
        def forward(self, x, control=None):
            return self.x_in(x) + self.control_proj(control)
    class Pipe:
        def __init__(self, transformer): self.transformer = transformer; self._cn = None
        def load_controlnet(self): self._cn = CN()  # loaded on the cpu, never moved
        def __call__(self, x, hint): return self.transformer(x, control=self._cn(hint))
    def build(): return ZImage()
    def app(m, device="cuda:0", dtype=None):
        pipe = Pipe(m); pipe.transformer.to(device); pipe.load_controlnet()
        return pipe(torch.randn(1, 8, device=device), torch.rand(1, 8))
    if __name__ == "__main__":
        app(build())
"""

ENCODER_FP32 = """
    import torch, torch.nn as nn, torch.nn.functional as F
    class TE(nn.Module):
        def __init__(self):
            super().__init__(); self.lin = nn.Linear(8, 8)
        def forward(self, t): return self.lin(t)
    class Attn(nn.Module):
        def __init__(self):
            super().__init__(); self.q = nn.Linear(8, 8); self.ff = nn.Linear(8, 8)
        def forward(self, x, ctx): return self.ff(F.scaled_dot_product_attention(self.q(x), ctx, ctx))
    class Pipe(nn.Module):
        def __init__(self):
            super().__init__(); self.text_encoder = TE(); self.transformer = Attn()
        def forward(self, x, t): return self.transformer(x, self.text_encoder(t))
    def build(): return Pipe()
    def app(m, device="cuda:0", dtype=torch.bfloat16):
        m.transformer.to(device, dtype)
        m.text_encoder.to(device)  # the custom encoder loaded in float32
        return m(torch.randn(1, 3, 8, device=device, dtype=dtype), torch.randn(1, 3, 8, device=device))
    if __name__ == "__main__":
        app(build())
"""

OFFLOADED_FP16 = """
    import torch, torch.nn as nn
    from accelerate import cpu_offload_with_hook
    class TE(nn.Module):
        def __init__(self):
            super().__init__(); self.tok = nn.Embedding(16, 8); self.enc = nn.Linear(8, 8)
        def forward(self, ids): return self.enc(self.tok(ids))
    class Transformer(nn.Module):
        def __init__(self):
            super().__init__(); self.proj = nn.Linear(8, 8); self.blocks = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
        def forward(self, x, clip): return self.blocks(x + self.proj(clip).mean(1, keepdim=True))
    class Pipe(nn.Module):
        def __init__(self):
            super().__init__(); self.text_encoder = TE(); self.transformer = Transformer()
        def forward(self, ids, x): return self.transformer(x, self.text_encoder(ids))
    def build(): return Pipe()
    def app(m, device="cuda:0", dtype=torch.bfloat16):
        m.to(dtype); m.text_encoder.to(torch.float16)  # one component loaded in float16
        hook = None
        for comp in (m.text_encoder, m.transformer):  # enable_model_cpu_offload
            _, hook = cpu_offload_with_hook(comp, execution_device=torch.device(device), prev_module_hook=hook)
        return m(torch.tensor([[1, 2, 3]], device=device), torch.randn(1, 1, 8, device=device, dtype=dtype))
    if __name__ == "__main__":
        app(build())
"""



def _doc(out: str) -> dict[str, Any]:
    return json.loads(out[out.index('{\n  "schema"'):])


def _said(fixes: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    """Each fix's code lines (comments dropped: run names the file relative to its folder) with its verdict; the
    name the program's function holds the model by (``app(m)``: run writes ``m.text_encoder``) read as simulate's
    ``model``."""
    return sorted(("\n".join(re.sub(r"(?<![\w.])m\.", "model.", x.split("  #")[0].rstrip())
                             for x in f["code"].splitlines() if not x.startswith("#")),
                   bool(f["proven"])) for f in fixes)


@pytest.mark.parametrize("name, program, dtype", [
    ("held_apart", HELD_APART, None),
    ("encoder_fp32", ENCODER_FP32, "bfloat16"),
    ("offloaded_fp16", OFFLOADED_FP16, "bfloat16"),  # the program's own cast line is fixed (a diff), proven alike
])
def test_run_prints_simulates_fix_and_verdict(tmp_path: Path, name: str, program: str, dtype: str | None) -> None:
    folder = tmp_path / name
    script = write(folder / "app.py", program)
    proc = run("--device", "cuda:0", *(("--dtype", dtype) if dtype else ()), "--json", str(script), cwd=folder)
    doc = _doc(proc.stdout)
    assert proc.returncode == 1 and not doc["ok"], proc.stderr[-3000:]
    mod = _load(script)
    sim = torchdoctor.simulate(mod.build(), device="cuda:0", dtype=getattr(torch, dtype) if dtype else None,
                               call=mod.app)
    assert not sim.ok
    ran, simulated = _said(doc["fixes"]), _said(sim.to_dict()["fixes"])
    assert ran and ran == simulated, (ran, simulated)
    # the pytest marker runs a test body in this block (select=False, as the marker does): the same again
    with torchdoctor.virtual_devices("cuda:0", getattr(torch, dtype) if dtype else None, raise_on_exit=False,
                                     select=False) as block:
        mod.app(mod.build())
    assert _said([f.to_dict() for f in block.fixes]) == ran
    # a fix run calls proven is one simulate's re-run proved: never upgraded by the proof at the op
    for code, proven in ran:
        assert proven, code
    # and no fix names a path of `model` that the model does not have
    model = mod.build()
    for f in doc["fixes"]:
        for attr in {x.split("model.", 1)[1].split(".")[0].split("[")[0]
                     for x in f["code"].splitlines() if x.startswith("model.")}:
            assert hasattr(model, attr), f["code"]
