"""A per-layer offloader of the program's own (each layer's forward wrapped: ``m.to(device)``, call, ``m.to("cpu")``)
over quantized layers that keep their scale as a plain tensor attribute (ostris/ai-toolkit's float8 text encoder
under layer offloading): ``Module.to`` moves parameters and buffers only, so the scale stays on the cpu. The fix
names the line of ``__init__`` that sets it and registers it as a buffer there (a diff), proven at the failing op;
never "no line that made them was recorded"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PROGRAM = """import torch, torch.nn as nn, torch.nn.functional as F
class QLinear(nn.Module):
    def __init__(self, lin):
        super().__init__()
        self.scale = lin.weight.detach().abs().amax(1, keepdim=True) / 448
        self.weight = nn.Parameter((lin.weight.detach() / self.scale).to(torch.{q}), requires_grad=False)
        self.bias = lin.bias
    def forward(self, x):
        return F.linear(x, self.weight.to(x.dtype) * self.scale.to(x.dtype), self.bias)
def offload(m, device):
    fwd = m.forward
    def call(*a):
        m.to(device)
        out = fwd(*a)
        m.to("cpu")
        return out
    m.forward = call
net = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
for i in (0, 2):
    net[i] = QLinear(net[i])
for m in net.modules():
    if isinstance(m, QLinear):
        offload(m, torch.device("{dev}"))
print(net(torch.randn(2, 8, device="{dev}")).shape)
"""


@pytest.mark.parametrize(("dev", "q"), [("cuda", "float8_e4m3fn"), ("xpu", "int8")])
def test_plain_scale_of_offloaded_layers_registered_where_set(tmp_path: Path, dev: str, q: str) -> None:
    (tmp_path / "app.py").write_text(PROGRAM.format(dev=dev, q=q))
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", dev, "app.py"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    out = proc.stdout + proc.stderr
    assert "0.scale, 2.scale are plain attributes of QLinear set at app.py:5: Module.to moves parameters and " \
           "buffers only; register it as a buffer at app.py:5: self.register_buffer('scale', ..., " \
           "persistent=False)" in out, out
    assert "+        self.register_buffer('scale', lin.weight.detach().abs().amax(1, keepdim=True) / 448, " \
           "persistent=False)" in out
    assert "fix proven" in out and "no line that made them was recorded" not in out
