"""The odd component of a pipeline is the one whose output fed the failing op in another dtype (an fp16 text encoder
feeding a bf16 transformer): the run casts that component, as guard's component rule does, never the consumer the
rest of the pipeline agrees with; where more components are in the feeder's dtype, the consumer is the odd one."""

from __future__ import annotations

from pathlib import Path

import torch

from support.apps import run_json
from torchdoctor._virtual.fixes import fix_items
from torchdoctor._virtual.prove import held
from torchdoctor._virtual.session import virtual_devices

PIPE = """\
import torch, torch.nn as nn
class TextEncoder(nn.Module):
    def __init__(s):
        super().__init__(); s.emb = nn.Embedding(10, 8); s.proj = nn.Linear(8, 8)
    def forward(s, ids): return s.proj(s.emb(ids))
class Transformer(nn.Module):
    def __init__(s):
        super().__init__(); s.blocks = nn.Sequential(*[nn.Linear(8, 8) for _ in range(4)])
    def forward(s, h): return s.blocks(h)
class Vae(nn.Module):
    def __init__(s):
        super().__init__(); s.dec = nn.Linear(8, 8)
    def forward(s, h): return s.dec(h)
class Pipe:
    def __init__(s, vae):
        s.text_encoder = TextEncoder().to("cuda", torch.float16)
        s.transformer = Transformer().to("cuda", torch.bfloat16)
        s.vae = Vae().to("cuda", torch.float16) if vae else None
    def __call__(s, ids):
        h = s.transformer(s.text_encoder(ids))
        return s.vae(h) if s.vae is not None else h
"""


def _app(tmp_path: Path, vae: bool) -> Path:
    app = tmp_path / "app.py"
    app.write_text(PIPE + f"pipe = Pipe({vae})\nout = pipe(torch.tensor([[1, 2, 3]], device='cuda'))\n")
    return app


def test_run_casts_the_feeding_text_encoder_not_the_transformer(tmp_path: Path) -> None:
    doc = run_json(_app(tmp_path, vae=False), "cuda")
    (fix,) = doc["fixes"]
    assert fix["code"].startswith("pipe.text_encoder.to(torch.bfloat16)  # every floating tensor of "
                                  "pipe.text_encoder (TextEncoder, built at app.py:16) is float16 while the model it "
                                  "feeds is bfloat16: cast that component"), fix
    assert fix["proven"], fix["tried"]
    assert '+        s.text_encoder = TextEncoder().to("cuda", torch.bfloat16)' in doc["patch"], doc["patch"]
    assert "transformer" not in fix["code"] and "float16)" not in fix["code"].replace("bfloat16)", "")


def test_three_components_the_lone_bf16_transformer_is_the_odd_one(tmp_path: Path) -> None:
    doc = run_json(_app(tmp_path, vae=True), "cuda")
    codes = "\n".join(f["code"] for f in doc["fixes"])
    assert "text_encoder" not in codes and "transformer" in codes and "torch.float16" in codes, codes


class _Te(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from transformers import CLIPTextConfig, CLIPTextModel

        cfg = CLIPTextConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, max_position_embeddings=16, bos_token_id=0, eos_token_id=1)
        self.text_encoder = CLIPTextModel(cfg)
        self.transformer = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(3)])
        self.vae = torch.nn.Linear(16, 4)  # a third part in the transformer's dtype (decodes later): the parts vote

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.transformer(self.text_encoder(ids).last_hidden_state)


def test_a_clip_text_encoder_inside_the_pipeline_module_is_cast_at_its_line() -> None:
    with virtual_devices("cuda", raise_on_exit=False) as sim:
        pipe = _Te()
        pipe.text_encoder.to("cuda", torch.float16)
        pipe.transformer.to("cuda", torch.bfloat16)
        pipe.vae.to("cuda", torch.bfloat16)
        pipe(torch.tensor([[1, 2, 3]], device="cuda"))
    codes = "\n".join(f.code for f in sim.fixes)
    assert "casts text_encoder to float16 while the rest of the model is bfloat16" in codes, codes
    assert 'pipe.text_encoder.to("cuda", torch.bfloat16)' in codes and "transformer" not in codes, codes
    assert all(f.proven for f in sim.fixes), [f.tried for f in sim.fixes]


def test_fed_by_the_caller_the_consumer_is_fixed_as_before() -> None:
    """No component made what fed it (the caller's fp16 tensor): the feeder rule stays out."""
    with virtual_devices("cuda", raise_on_exit=False) as sim:
        te = torch.nn.Linear(8, 8).to("cuda", torch.float16)
        tr = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to("cuda", torch.bfloat16)
        te(torch.ones(2, 8, device="cuda", dtype=torch.float16))
        tr(torch.ones(2, 8, device="cuda", dtype=torch.float16))
    items = fix_items(sim.problems, sim.device, None, sim.sources, held(tr), cases=sim._rec.cases.cases) or []
    assert not any("te.to(" in f.code for f in items), [f.code for f in items]

