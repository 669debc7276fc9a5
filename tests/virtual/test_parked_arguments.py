"""Arguments the program parks on the cpu at its own line (cached prompt embeddings kept there between a pipeline's
stages, ``embeds.cpu()``) and hands back to a model on the accelerator: one fix, at the line that hands them on, with
the program's own name for the device — the parking kept (``_virtual/callmove``). Under ``torchdoctor run --device
cuda`` on tiny apps written here: a pipeline class whose ``__call__`` passes its parameters on to diffusers'
``LTX2TextConnectors`` (the fix goes to the app's ``pipe(...)`` call), and a model the app calls itself (the fix goes
to that call). Applied, a virtual re-run is clean and plain python still runs on this cpu. The tensors made from
the parked arguments are one cause in the report (``_run/onecause``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

PIPELINE = """
    import torch
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


    class Pipeline:
        def __init__(self, connectors):
            self.connectors = connectors

        @torch.no_grad()
        def __call__(self, prompt_embeds, prompt_attention_mask, latents):
            video, audio, mask = self.connectors(prompt_embeds, prompt_attention_mask, padding_side="left")
            return latents + video.mean()


    connectors = LTX2TextConnectors(caption_channels=8, text_proj_in_factor=2, video_connector_num_attention_heads=2,
                                    video_connector_attention_head_dim=4, video_connector_num_layers=1,
                                    video_connector_num_learnable_registers=None, audio_connector_num_attention_heads=2,
                                    audio_connector_attention_head_dim=4, audio_connector_num_layers=1,
                                    audio_connector_num_learnable_registers=None).to(device)
    pipe = Pipeline(connectors)
    embeds, mask = torch.randn(1, 6, 16, device=device), torch.ones(1, 6, dtype=torch.long, device=device)
    cached = {"prompt_embeds": embeds.cpu(), "prompt_attention_mask": mask.cpu()}
    latents = torch.randn(1, 4, device=device)
    for stage in ("base", "refine"):
        latents = pipe(cached["prompt_embeds"], cached["prompt_attention_mask"], latents)
    print("done", tuple(latents.shape))
"""

DIRECT = """
    import torch
    from torch import nn

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(16, 8), nn.GELU(), nn.Linear(8, 2)).to(device)
    with torch.no_grad():
        feats = model[0](torch.randn(3, 16, device=device))
        kept = torch.randn(3, 16, device=device).cpu()
        out = model(kept)
    print("done", tuple(out.shape))
"""


def _run(root: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", "--json", "main.py"],
                          cwd=root, env=ENV, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    out = proc.stdout
    return json.loads(out[out.index('{\n  "schema"'):])


def _applied(root: Path, text: str) -> tuple[dict, subprocess.CompletedProcess[str]]:
    (root / "main.py").write_text(textwrap.dedent(text).lstrip())
    doc = _run(root)
    subprocess.run(["git", "init", "-q", "."], cwd=root, check=True)
    subprocess.run(["git", "apply", "-"], cwd=root, input=doc["patch"] or "", text=True, check=True)
    plain = subprocess.run([sys.executable, "main.py"], cwd=root, env=ENV, capture_output=True, text=True,
                           timeout=300, stdin=subprocess.DEVNULL)
    return doc, plain


def test_cached_prompt_embeddings_are_moved_at_the_apps_call_of_the_pipeline(tmp_path: Path) -> None:
    doc, plain = _applied(tmp_path, PIPELINE)
    assert len(doc["fixes"]) == 1, doc["fixes"]
    assert len(doc["causes"]) == 1, doc["causes"]  # one parking line, however many ops its tensors reach
    assert doc["causes"][0]["message"].startswith("text_encoder_hidden_states, attention_mask (arguments of the "
                                                  "LTX2TextConnectors call, made by Tensor.to at main.py:24) are on "
                                                  "cpu while the run is on cuda:0: one cause, "), doc["causes"]
    fix = doc["fixes"][0]
    assert fix["proven"], fix
    assert fix["code"].startswith("# input 0 (text_encoder_hidden_states), input 1 (attention_mask): parked on the "
                                  "cpu by the program and handed on at main.py:27 to connectors as they are")
    assert "where they are parked stays as it is" in fix["code"]
    patch = doc["patch"]
    assert ('+    latents = pipe(cached["prompt_embeds"].to(device), cached["prompt_attention_mask"].to(device), '
            'latents)') in patch, patch
    changed = [ln for ln in patch.splitlines() if ln.startswith(("+", "-")) and not ln.startswith(("+++", "---"))]
    assert len(changed) == 2 and not any("cuda:0" in ln or ".cpu()" in ln for ln in changed), changed  # parking kept
    assert plain.returncode == 0 and "done" in plain.stdout, plain.stderr[-600:]
    again = _run(tmp_path)
    assert again["ok"] and not again["problems"], again


def test_an_argument_the_app_parked_is_moved_where_the_app_calls_the_model(tmp_path: Path) -> None:
    doc, plain = _applied(tmp_path, DIRECT)
    fix = doc["fixes"][0]
    assert fix["proven"] and "parked on the cpu by the program and handed to model at main.py:9" in fix["code"], fix
    assert "+    out = model(kept.to(device))" in doc["patch"], doc["patch"]
    assert plain.returncode == 0 and "done" in plain.stdout, plain.stderr[-600:]
    again = _run(tmp_path)
    assert again["ok"] and not again["problems"], again
