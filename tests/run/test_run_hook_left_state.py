"""4-bit (bitsandbytes nf4) layers kept in cpu memory and streamed per layer by a forward pre-hook that swaps each
parameter's ``.data`` (a fast weight swap, no ``Module.to``): the weight's ``quant_state`` stays on the cpu. The fix
names the hook's ``p.data =`` line and moves each layer whole there, never the whole model (which would undo the
streaming); proven at the failing 4-bit op."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.apps import run_json

APP = '''import torch, torch.nn as nn
import bitsandbytes as bnb

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=torch.float32, quant_type="nf4")

    def forward(self, x):
        return self.fc(x)


def swap_in(module, args):
    for p in module.parameters():
        p.data = p.data.to(device)


net = nn.Sequential(Layer(), Layer()).to("cpu")  # quantized in cpu memory, streamed per layer
for layer in net:
    layer.register_forward_pre_hook(swap_in)
with torch.no_grad():
    y = net(torch.randn(2, 64, device=device))
print("ran", tuple(y.shape))
'''


def test_a_data_swap_hook_that_leaves_quant_state_behind_is_named_never_a_whole_model_move(tmp_path: Path) -> None:
    pytest.importorskip("bitsandbytes")
    (tmp_path / "main.py").write_text(APP)
    doc = run_json(tmp_path / "main.py", "cuda")
    assert {p["path"] for p in doc["problems"]} >= {"0.fc.weight.quant_state.absmax", "1.fc.weight.quant_state.code"}
    [fix] = doc["fixes"]
    assert fix["code"].startswith("# `swap_in` at main.py:18 moves each parameter's data (`p.data = ...`) and not "
                                  "what hangs off it (quant_state.absmax, quant_state.code"), fix["code"]
    assert "move each layer with Module.to there" in fix["code"] and "never the whole model" in fix["code"]
    assert "torchdoctor.move(" not in fix["code"] and fix["proven"], fix
