"""LoRA wrappers of ``nn.Linear`` layers injected on every projection after ``unet.to(device, torch.float16)``
(sd-scripts / ComfyUI style, hunt I): the adapters' float32 tensors are as many as the float16 layers they wrap.

- On a virtual cuda the model's dtype is the one the program cast it to (``.to(device, torch.float16)`` at its own
  line), not a tie-break of a vote: the adapters are the odd ones, fixed at the line that builds them,
  ``LoRALinear(child).to(child.weight.device, child.weight.dtype)`` -- never ``torchdoctor.move(unet, ...,
  dtype=torch.float32)`` upcasting the model, nor an input cast to float32.
- On this CPU (the dtype error is real) guard casts every injected adapter, of every projection of every block, not
  only the failing ``to_q``'s: one loop, proven by the whole forward, and the pasted loop makes the program run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from run.test_run_cli import ENV, TIMEOUT, run, write

APP = """
    import torch, torch.nn as nn
    torch.manual_seed(0)

    class LoRALinear(nn.Module):
        def __init__(self, base, rank=4):
            super().__init__()
            self.base = base
            self.lora_down = nn.Linear(base.in_features, rank, bias=False)
            self.lora_up = nn.Linear(rank, base.out_features, bias=False)
            nn.init.zeros_(self.lora_up.weight)

        def forward(self, x):
            return self.base(x) + self.lora_up(self.lora_down(x))

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.to_q, self.to_k = nn.Linear(32, 32), nn.Linear(32, 32)
            self.to_v, self.to_out = nn.Linear(32, 32), nn.Linear(32, 32)

        def forward(self, x):
            q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
            return self.to_out(torch.softmax(q @ k.transpose(-1, -2) / 5.6, -1) @ v)

    def inject(model):
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear) and name.startswith("to_"):
                    setattr(parent, name, LoRALinear(child))

    device = "DEVICE"
    unet = nn.Sequential(Attn(), Attn()).to(device, torch.float16)
    inject(unet)  # INJECT
    x = torch.randn(1, 8, 32, device=device, dtype=torch.float16)
    with torch.no_grad():
        y = unet(x)
    print("OK", y.dtype)
"""


def test_on_a_virtual_gpu_the_adapters_are_built_where_the_layer_they_wrap_is(tmp_path: Path) -> None:
    write(tmp_path / "app.py", APP.replace("DEVICE", "cuda:0"))
    proc = run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path)
    report = json.loads(proc.stdout[proc.stdout.index("\n{") + 1:])  # after the program's own print
    codes = "\n".join(f["code"] for f in report["fixes"])
    assert "LoRALinear(child).to(child.weight.device, child.weight.dtype)" in codes, codes
    assert "torch.float32" not in codes, codes  # never the model, nor its input, upcast
    assert all(f["proven"] for f in report["fixes"]), report["fixes"]
    assert "+                setattr(parent, name, LoRALinear(child).to(child.weight.device, " \
           "child.weight.dtype))" in report["patch"], report["patch"]


def test_on_this_cpu_every_injected_adapter_is_cast_by_one_proven_loop(tmp_path: Path) -> None:
    app = write(tmp_path / "app.py", APP.replace("DEVICE", "cpu"))
    proc = run("--json", "app.py", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    (finding,) = json.loads(proc.stdout)["findings"]
    fix = finding["fix"]
    for block in (0, 1):
        for proj in ("to_q", "to_k", "to_v", "to_out"):
            for part in ("lora_down", "lora_up"):
                assert f"unet[{block}].{proj}.{part}" in fix, fix
    assert fix.startswith("for m in (") and fix.endswith("):\n    m.to(torch.float16)"), fix
    assert finding["proven"] is True, finding["culprit"]
    fixed = tmp_path / "fixed.py"
    fixed.write_text(app.read_text().replace("inject(unet)  # INJECT\n", "inject(unet)\n" + fix + "\n"))
    done = subprocess.run([sys.executable, str(fixed)], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert done.returncode == 0 and "OK torch.float16" in done.stdout, done.stderr[-2000:]
