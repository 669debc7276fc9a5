"""One cause, one finding: an error whose culprit list is cut short ("... and 1 more float16 parameter") is not
followed by a second finding for the parameter the list left out, which guard also recorded with the same fix
(sd-scripts' fp16 LoRA network: ``network.to("cuda", dtype=weight_dtype)`` makes the trained weights float16 and
``GradScaler.unscale_`` refuses them, 67372a/LoRA_Easy_Training_Scripts #57)."""

from __future__ import annotations

from pathlib import Path

from support.apps import run_json

APP = '''import torch, torch.nn as nn
class LoRA(nn.Module):
    def __init__(self, base, r=4):
        super().__init__(); self.base = base
        self.down = nn.Linear(base.in_features, r, bias=False); self.up = nn.Linear(r, base.out_features, bias=False)
    def forward(self, x): return self.base(x) + self.up(self.down(x))
unet = nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 16)).to("cuda", torch.float16).requires_grad_(False)
unet[0] = LoRA(unet[0]); unet[2] = LoRA(unet[2])
network = nn.ModuleList([unet[0], unet[2]])
network.to("cuda", dtype=torch.float16)
params = [p for n, p in network.named_parameters() if "base" not in n]
opt = torch.optim.AdamW(params, lr=1e-4)
scaler = torch.amp.GradScaler("cuda")
x = torch.randn(4, 16, device="cuda")
with torch.autocast("cuda", dtype=torch.float16):
    loss = (unet(x).float() - x).pow(2).mean()
scaler.scale(loss).backward()
scaler.unscale_(opt)
'''


def test_four_float16_trained_parameters_are_one_finding(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(APP)
    doc = run_json(tmp_path / "app.py", "cuda")
    [finding] = doc["findings"]  # not a second "dtype problem: 2.up.weight is float16" recorded by guard
    assert finding["error"] == "ValueError: Attempting to unscale FP16 gradients."
    assert "and 1 more float16 parameter" in finding["culprit"]
    # the fix names the module the program cast (the LoRA network it holds apart), at the last cast that made the
    # trained parameters float16, never a `model` the program does not have; the frozen bases it holds stay float16
    assert "for p in network.parameters():" in finding["fix"] and "model" not in finding["fix"], finding["fix"]
    said = " ".join(str(v) for v in finding.values())
    assert 'cast to float16 at app.py:10 (`network.to("cuda", dtype=torch.float16)`)' in said, said
