"""An offloaded KV cache whose layers the library moved to the cpu and nothing brought back (transformers PR
#46748, hunt A5: a hybrid model's prefetch of "the next index" landed on a conv layer). The tensors are named as the
program holds them (``cache.layers[1].keys``, one problem per layer), the library's own move is named, and the
program's own override of the library's method (its ``prefetch``) is named with its lines; never a ``cache.to(...)``
the cache has no method for, never an edit of the library's line. The library's own cache is quiet."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

APP = """import sys, torch
from transformers import {cfg}, {model}, DynamicCache

class {cls}(DynamicCache):
    def prefetch(self, layer_idx, only_non_sliding=True):
        {body}

cfg = {cfg}(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64{extra})
torch.manual_seed(0)
model = {model}(cfg).to("cuda").eval()
past = (DynamicCache if "--library" in sys.argv else {cls})(config=model.config, offloading=True)
out = model.generate(torch.randint(0, 64, (1, 5), device="cuda"), past_key_values=past, max_new_tokens=3,
                     do_sample=False)
print(out.shape)
"""
HYBRID = dict(cfg="Lfm2Config", model="Lfm2ForCausalLM", cls="NextIndexCache", extra=", full_attn_idxs=[1, 3]",
              body="with self.prefetch_stream:\n            self.layers[layer_idx % len(self.layers)].prefetch()")
LLAMA = dict(cfg="LlamaConfig", model="LlamaForCausalLM", cls="NoPrefetchCache", extra="", body="return None")


def _run(cwd: Path, *args: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", "--json", "app.py", *args],
                       cwd=cwd, capture_output=True, text=True, timeout=300)
    return json.loads(r.stdout[r.stdout.index('{\n  "schema"'):])


@pytest.mark.parametrize("shape", [HYBRID, LLAMA], ids=["hybrid-next-index", "llama-no-prefetch"])
def test_an_offloaded_layer_is_named_by_its_holder_and_the_programs_override(tmp_path: Path, shape: dict) -> None:
    (tmp_path / "app.py").write_text(APP.format(**shape))
    doc = _run(tmp_path)
    paths = [p["path"] for p in doc["problems"]]
    assert paths and all(p.startswith("past.layers[") for p in paths), paths
    assert "past.layers[1].keys" in paths if shape is HYBRID else len({p.split(".")[1] for p in paths}) >= 2, paths
    [fix] = doc["fixes"]
    code = fix["code"]
    assert " by DynamicLayer.offload (transformers/cache_utils.py:" in code or \
        ".offload (transformers/cache_utils.py:" in code, code
    assert f"past is of class {shape['cls']}, the program's own, whose prefetch (app.py:5-" in code, code
    assert "drop the override; never an edit of the library's line" in code, code
    assert "past.to(" not in code and not fix["proven"] and "not re-run" in fix["tried"], fix
    assert not _run(tmp_path, "--library")["problems"]  # the library's own prefetch brings them back
