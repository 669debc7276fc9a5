"""LoRA layers injected after ``model.to('cuda')`` (AstrAI's ``setattr(model, name, LoRALinear(mod))``) hold their own
new parameters on the cpu while the layer they wrap moved with the model: one fix, at the line that builds them,
moved to the wrapped layer's device (never ``.data`` lines, never a device hard-coded into the class), proven."""

from __future__ import annotations

from pathlib import Path

from support.apps import run_json

SETATTR = """\
import torch, torch.nn as nn
class LoRALinear(nn.Module):
    def __init__(s, base, r=4):
        super().__init__()
        s.base = base
        s.lora_A = nn.Parameter(torch.randn(r, base.in_features) * 0.01)
        s.lora_B = nn.Parameter(torch.zeros(base.out_features, r))
    def forward(s, x): return s.base(x) + x @ s.lora_A.t() @ s.lora_B.t()
def inject_lora(model):
    for name, mod in list(model.named_children()):
        if isinstance(mod, nn.Linear): setattr(model, name, LoRALinear(mod))
        else: inject_lora(mod)
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).to("cuda")
inject_lora(model)
print(model(torch.randn(2, 8, device="cuda")).shape)
"""

INDEXED = """\
import torch, torch.nn as nn
class Adapter(nn.Module):
    def __init__(self, layer, r=2):
        super().__init__()
        self.layer = layer
        self.down = nn.Parameter(torch.zeros(r, layer.in_features))
        self.up = nn.Parameter(torch.zeros(layer.out_features, r))
    def forward(self, x): return self.layer(x) + (x @ self.down.t()) @ self.up.t()
net = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8)).to("cuda")
for i in (0, 2):
    net[i] = Adapter(net[i])
print(net(torch.ones(2, 8, device="cuda")).shape)
"""


def _one_fix(tmp_path: Path, text: str) -> tuple[dict, str]:
    app = tmp_path / "app.py"
    app.write_text(text)
    doc = run_json(app, "cuda")
    (fix,) = doc["fixes"]
    assert fix["proven"], fix["tried"]
    assert ".data" not in fix["code"] and "torchdoctor.move" not in fix["code"], fix["code"]
    return fix, doc["patch"]


def test_lora_injected_after_the_move_is_moved_where_it_is_built(tmp_path: Path) -> None:
    fix, patch = _one_fix(tmp_path, SETATTR)
    assert fix["code"].startswith("# 2 LoRALinear modules are built at app.py:11 after the model was moved, on the "
                                  "cpu: move them where they are built (LoRALinear(mod).to(mod.weight.device))"), fix
    assert "+        if isinstance(mod, nn.Linear): setattr(model, name, LoRALinear(mod).to(mod.weight.device))" \
        in patch, patch


def test_an_adapter_put_in_by_index_follows_the_layer_it_wraps(tmp_path: Path) -> None:
    fix, patch = _one_fix(tmp_path, INDEXED)
    assert "+    net[i] = Adapter(net[i]).to(net[i].weight.device)" in patch, patch
