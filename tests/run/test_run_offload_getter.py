"""A prompt helper (compel-style) looks token embeddings up through the text encoder's getter
(``text_encoder.get_input_embeddings()(ids)``) while accelerate's ``cpu_offload_with_hook`` offloads the encoder
(as ``enable_model_cpu_offload`` does): the layer meets its weights on the cpu. The fix gives that layer its own hook
at the program's line that puts the encoder's, as the program names both; never a per-weight ``.data`` move nor a
device literal. Applied: the virtual re-run is quiet and plain python runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.apps import committed, run_json

APP = '''import torch, torch.nn as nn
from accelerate import cpu_offload_with_hook


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.mix = nn.Embedding(32, 8), nn.Linear(8, 8)

    def get_input_embeddings(self):
        return self.embed

    def forward(self, ids):
        return self.mix(self.embed(ids))


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
encoder, denoiser = Encoder(), nn.Linear(8, 8)
encoder, enc_hook = cpu_offload_with_hook(encoder, device)
denoiser, den_hook = cpu_offload_with_hook(denoiser, device, prev_module_hook=enc_hook)


@torch.no_grad()
def embeds(ids):
    empty = encoder.get_input_embeddings()(torch.zeros_like(ids))
    return encoder(ids) + empty


for prompt in ([1, 2, 3], [4, 5, 6]):
    x = denoiser(embeds(torch.tensor([prompt], device=device)))
print("ran", tuple(x.shape))
'''


def test_a_layer_fetched_by_a_getter_under_model_offload_gets_its_own_hook(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(APP)
    committed(tmp_path)
    doc = run_json(tmp_path / "main.py", "cuda")
    assert [p["path"] for p in doc["problems"]] == ["embed.weight"], doc["problems"]
    [fix] = doc["fixes"]
    assert fix["code"].startswith("cpu_offload_with_hook(encoder.get_input_embeddings(), device)  # before main.py:19:")
    assert "`encoder` is offloaded by accelerate's hook (CpuOffload, put at main.py:19)" in fix["code"]
    assert "main.py:25 calls `encoder.get_input_embeddings()` outside it; give that layer its own hook" in fix["code"]
    assert ".data =" not in fix["code"] and "'cuda:0'" not in fix["code"] and fix["proven"], fix
    assert "+cpu_offload_with_hook(encoder.get_input_embeddings(), device)\n+encoder, enc_hook" in doc["patch"]
    (tmp_path / "fix.diff").write_text(doc["patch"])
    subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, check=True, timeout=60)
    again = run_json(tmp_path / "main.py", "cuda")
    assert again["ok"] and not again["problems"], again["problems"]
    plain = subprocess.run([sys.executable, "main.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr[-2000:]
