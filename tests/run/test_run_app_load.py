"""An app whose model manager offloads the text encoder when the sampler loads the denoiser, and a second prompt
that encodes again without loading it back (the ComfyUI / Forge "model management" shape, rebuilt in a few lines):
the fix is the app's own load call, the one its top level made once, put before the use (``mm.load(te)``), never a
device written out (``te.to('cuda:0')``, which the manager would not know about) (hunt of the twenty-fifth session,
F12). Proven, and applied the program runs clean on the virtual device.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from run.test_run_cli import run, write

APP = """
    import torch, torch.nn as nn

    class ModelManager:
        def __init__(self, device):
            self.device, self.loaded = device, []

        def load(self, *models):
            for m in self.loaded:
                if m not in models:
                    m.to("cpu")
            for m in models:
                m.to(self.device)
            self.loaded = list(models)

    class TextEncoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.l = nn.Embedding(100, 32), nn.Linear(32, 32)

        def forward(self, ids):
            return self.l(self.emb(ids))

    device = torch.device("cuda:0")
    mm = ModelManager(device)
    te, unet = TextEncoder(), nn.Linear(32, 32)

    def encode(prompt_ids):
        return te(prompt_ids.to(device))

    def sample(ctx):
        mm.load(unet)
        return unet(torch.randn(1, 4, 32, device=device)) + ctx.mean(1, keepdim=True)

    mm.load(te)
    out = sample(encode(torch.tensor([[1, 2, 3]])))
    out2 = sample(encode(torch.tensor([[4, 5, 6]])))
    print("done", tuple(out2.shape))
"""


def test_the_apps_own_load_call_is_put_before_the_second_use(tmp_path: Path) -> None:
    write(tmp_path / "app.py", APP)
    proc = run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path)
    report = json.loads(proc.stdout[proc.stdout.index("\n{") + 1:])
    [fix] = [f for f in report["fixes"] if not f["code"].startswith("# ")]
    assert fix["code"].startswith("mm.load(te)  # before app.py:"), fix["code"]
    assert "`te` was offloaded to cpu by `load`" in fix["code"] and fix["proven"], fix
    assert "+    mm.load(te)\n+    return te(prompt_ids.to(device))\n" in report["patch"], report["patch"]
    assert "'cuda:0'" not in report["patch"]
    subprocess.run(["git", "apply", "-"], input=report["patch"], cwd=tmp_path, text=True, check=True, timeout=60)
    again = run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path)
    assert json.loads(again.stdout[again.stdout.index("\n{") + 1:])["ok"], again.stdout[-3000:]
