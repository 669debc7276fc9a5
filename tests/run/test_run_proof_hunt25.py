"""Two proofs ``torchdoctor run`` gets right on rebuilt public reports (hunt of the twenty-fifth session).

- Whisper in float16 fed ``torch.from_numpy`` features (fast-whisper-finetuning#14): a Hugging Face model is called
  with keywords only, so the whole forward is re-run with the caller's keyword arguments (not only its positional
  ones) and the fix lands at the maker's line, ``torch.from_numpy(feats).to(torch.float16)``, as a diff, proven; the
  JSON finding says ``proven``. Applied to the file, the program runs.
- A custom node computing with a GGUF-style layer's packed ``uint8`` weight directly (Flux2Klein-Enhancer#19): a
  bfloat16 input beside it is no fix -- with the input cast, the op still computes with the stored integers -- so it
  is unproven at the op and no patch is offered (it was "proven" and patched before, and the error stayed).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from run.test_run_cli import ENV, TIMEOUT, run, write

WHISPER = """
    import numpy as np, torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    torch.manual_seed(0)
    cfg = WhisperConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16,
                        max_source_positions=8, max_target_positions=16, vocab_size=100, decoder_start_token_id=1,
                        pad_token_id=0, eos_token_id=2, bos_token_id=1)
    model = WhisperForConditionalGeneration(cfg).to(torch.float16)
    feats = np.random.randn(1, 16, 16).astype(np.float32)  # what a feature extractor returns
    input_features = torch.from_numpy(feats)
    with torch.no_grad():
        out = model(input_features=input_features, decoder_input_ids=torch.tensor([[1, 5, 6]]))
    print("OK", out.logits.dtype)
"""


def test_a_keyword_called_model_is_proven_by_its_whole_forward_and_fixed_at_the_maker(tmp_path: Path) -> None:
    app = write(tmp_path / "app.py", WHISPER)
    proc = run("--json", "app.py", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    (finding,) = json.loads(proc.stdout)["findings"]
    assert finding["fix"].startswith("input_features = torch.from_numpy(feats).to(torch.float16)"), finding
    assert finding["proven"] is True, finding
    assert "fix proven: the whole forward runs again on a copy of the model with input_features -> float16" in \
        finding["culprit"], finding["culprit"]
    assert "+input_features = torch.from_numpy(feats).to(torch.float16)" in finding["diff"]
    subprocess.run(["git", "apply", "--unsafe-paths", "-"], input=finding["diff"], text=True, cwd=tmp_path,
                   check=True, capture_output=True)
    fixed = subprocess.run([sys.executable, str(app)], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                           timeout=TIMEOUT)
    assert fixed.returncode == 0 and "OK torch.float16" in fixed.stdout, fixed.stderr[-2000:]


PACKED = """
    import torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0)

    class GGMLLinear(nn.Module):  # uint8 blocks and float16 scales, dequantized on every call
        def __init__(self, inf, outf):
            super().__init__()
            w = torch.randn(outf, inf)
            scale = w.abs().amax(1, keepdim=True) / 127
            self.weight = nn.Parameter((torch.round(w / scale) + 128).to(torch.uint8), requires_grad=False)
            self.register_buffer("scale", scale.half())
            self.bias = nn.Parameter(torch.zeros(outf))

        def forward(self, x):
            w = (self.weight.to(torch.int16) - 128).to(x.dtype) * self.scale.to(x.dtype)
            return F.linear(x, w, self.bias.to(x.dtype))

    class DiT(nn.Module):
        def __init__(self):
            super().__init__()
            self.txt_in = GGMLLinear(16, 32)
            self.out = GGMLLinear(32, 16)

        def forward(self, x):
            return self.out(self.txt_in(x))

    def enhance(model, cond):  # the node reuses txt_in's stored weight directly
        return F.linear(cond, model.txt_in.weight, model.txt_in.bias)

    model = DiT().to("cuda:0")
    cond = torch.randn(1, 4, 16, device="cuda:0", dtype=torch.bfloat16)
    with torch.no_grad():
        y = model(cond)
        e = enhance(model, cond)
"""


def test_an_input_cast_beside_packed_storage_is_never_proven_nor_patched(tmp_path: Path) -> None:
    write(tmp_path / "app.py", PACKED)
    proc = run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["patch"] is None, report["patch"]
    for fix in report["fixes"]:
        assert not fix["proven"], fix
        if "torch.randn" in fix["code"]:
            assert "it still computes with uint8 storage directly" in fix["tried"], fix
    again = run("--device", "cuda:0", "app.py", cwd=tmp_path)
    text = again.stdout + again.stderr
    assert "culprit model.txt_in.weight: u8[32,16]@cuda:0" in text, text
    assert "Patch (git apply)" not in text and "fix proven" not in text, text
