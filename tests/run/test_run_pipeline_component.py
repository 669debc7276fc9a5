"""The component whose dtype differs from its neighbours is the culprit, and its fix casts (or loads) that component
(issue 41 point 5; hunt A and IP of the twenty-fifth session).

- A pipeline object holding a float16 CLIP text encoder beside a bfloat16 Llama encoder and transformer (diffusers
  #11436, HiDream): the fix is ``pipe.text_encoder.to(torch.bfloat16)`` -- the pipeline's own name for it, read from
  ``self.text_encoder`` in its ``__call__`` -- never a cast of the encoder's output where it is handed over. Pasted,
  the program runs.
- A custom node building its image projection in float32 inside a float16 app (ComfyUI_IPAdapter_plus#140): the
  culprit is the projection, and the fix casts it as the node holds it (``self.image_proj``, at the node's line),
  never the app's float16 embeddings upcast in the app's own file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from run.test_run_cli import ENV, TIMEOUT, run, write

PIPE = """
    import torch, torch.nn as nn
    from transformers import CLIPTextConfig, CLIPTextModel, LlamaConfig, LlamaModel
    torch.manual_seed(0)

    class Transformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.caption_projection = nn.Linear(32, 48)
            self.llama_projection = nn.Linear(32, 48)
            self.out = nn.Linear(48, 48)

        def forward(self, clip_embeds, llama_embeds):
            h = self.caption_projection(clip_embeds).mean(1) + self.llama_projection(llama_embeds).mean(1)
            return self.out(h)

    class Pipe:
        def __init__(self, text_encoder, text_encoder_4, transformer):
            self.text_encoder, self.text_encoder_4, self.transformer = text_encoder, text_encoder_4, transformer

        def __call__(self, ids):
            clip = self.text_encoder(ids).last_hidden_state
            llama = self.text_encoder_4(ids).last_hidden_state
            return self.transformer(clip, llama)

    te = CLIPTextModel(CLIPTextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                      vocab_size=100, max_position_embeddings=16)).to(torch.float16)
    te4 = LlamaModel(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=2, vocab_size=100)).to(torch.bfloat16)
    pipe = Pipe(te, te4, Transformer().to(torch.bfloat16))
    # FIX HERE
    with torch.no_grad():
        out = pipe(torch.randint(0, 100, (1, 8)))
    print("OK", out.dtype)
"""


def test_the_float16_encoder_of_a_bfloat16_pipeline_is_cast_by_the_pipelines_name(tmp_path: Path) -> None:
    app = write(tmp_path / "app.py", PIPE)
    proc = run("--json", "app.py", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    (finding,) = json.loads(proc.stdout)["findings"]
    fix = finding["fix"]
    assert fix.startswith("pipe.text_encoder.to(torch.bfloat16)  # pipe.text_encoder computes in float16, the rest "
                          "of the pipeline in bfloat16"), fix
    assert "last_hidden_state.to(" not in fix and finding["diff"] is None, finding
    fixed = tmp_path / "fixed.py"
    fixed.write_text(app.read_text().replace("# FIX HERE", fix.splitlines()[0]))
    done = subprocess.run([sys.executable, str(fixed)], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert done.returncode == 0 and "OK torch.bfloat16" in done.stdout, done.stderr[-2000:]


NODE = """
    import torch, torch.nn as nn

    class ImageProjModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(32, 48 * 4)
            self.norm = nn.LayerNorm(48)

        def forward(self, embeds):
            return self.norm(self.proj(embeds).reshape(-1, 4, 48))

    class IPAdapterApply:
        def __init__(self):
            self.image_proj = ImageProjModel()  # dtype never set

        def apply(self, clip_embeds):
            return self.image_proj(clip_embeds)  # APPLY
"""

MAIN = """
    import logging, traceback, torch, torch.nn as nn
    from custom_nodes.ipa.nodes import IPAdapterApply
    clip_vision = nn.Linear(24, 32).to(torch.float16)

    def execute():
        embeds = clip_vision(torch.randn(1, 24, dtype=torch.float16))
        return IPAdapterApply().apply(embeds)

    try:
        print("OK", execute().dtype)
    except Exception as e:
        logging.error("!!! Exception during processing !!! %s", e)
        logging.error(traceback.format_exc())
"""


def test_a_plugins_float32_projection_is_cast_as_the_node_holds_it(tmp_path: Path) -> None:
    write(tmp_path / "custom_nodes" / "__init__.py", "")
    write(tmp_path / "custom_nodes" / "ipa" / "__init__.py", "")
    write(tmp_path / "custom_nodes" / "ipa" / "nodes.py", NODE)
    write(tmp_path / "main.py", MAIN)
    proc = run("--json", "main.py", cwd=tmp_path)
    (finding,) = json.loads(proc.stdout)["findings"]
    line = next(i for i, x in enumerate((tmp_path / "custom_nodes/ipa/nodes.py").read_text().splitlines(), 1)
                if "# APPLY" in x)
    assert finding["fix"].startswith(f"self.image_proj.to(torch.float16)  # at nodes.py:{line}"), finding["fix"]
    assert "clip_vision(" not in finding["fix"] and finding["diff"] is None, finding
    assert "culprit `<root>`: computes in float32 while the rest of the model feeds it float16" in finding["culprit"]
