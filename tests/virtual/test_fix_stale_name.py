"""A name bound to a tensor before the function moved it (TransformerLens #1508's ``generate``: ``input_tokens = inp``
then ``inp = inp.to(device)``) still holds the cpu tensor: the fix is where that name is read, naming the line that
bound it, proven at the failing op; not the caller's tensor, which would hide the bug for every other caller."""

from __future__ import annotations

from pathlib import Path

from support.apps import run_json

GENERATE = """\
import torch, torch.nn as nn
class TinyLM(nn.Module):
    def __init__(s):
        super().__init__(); s.emb = nn.Embedding(20, 8); s.head = nn.Linear(8, 20)
    def forward(s, ids): return s.head(s.emb(ids))
    @torch.no_grad()
    def generate(s, inp, n=3):
        input_tokens = inp
        inp = inp.to(s.head.weight.device)
        out = []
        for _ in range(n):
            nxt = s(inp)[:, -1].argmax(-1, keepdim=True)
            out.append(nxt); inp = torch.cat([inp, nxt], 1)
        return torch.cat([input_tokens] + out, 1)
model = TinyLM().to("cuda")
print(model.generate(torch.tensor([[1, 2, 3]])).shape)
"""

CUDA_CALL = """\
import torch
def scale(batch, w):
    raw = batch
    batch = batch.cuda()
    y = batch * w
    return y + raw
print(scale(torch.ones(4), torch.ones(4, device="cuda")).device)
"""


def test_the_stale_name_is_fixed_where_it_is_read(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(GENERATE)
    doc = run_json(app, "cuda")
    (fix,) = doc["fixes"]
    assert fix["code"].startswith("# app.py:8 binds input_tokens to inp before app.py:9 moves inp"), fix
    assert fix["proven"], fix["tried"]
    assert "+        return torch.cat([input_tokens.to(inp.device)] + out, 1)" in doc["patch"], doc["patch"]
    assert "device='cuda:0'" not in doc["patch"]


def test_a_name_kept_before_cuda_is_fixed_too(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(CUDA_CALL)
    doc = run_json(app, "cuda")
    codes = "\n".join(f["code"] for f in doc["fixes"])
    assert "app.py:3 binds raw to batch before app.py:4 moves batch" in codes, codes
    assert "+    return y + raw.to(batch.device)" in doc["patch"], doc["patch"]
