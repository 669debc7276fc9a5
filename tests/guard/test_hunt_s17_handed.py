"""Session 17, guard: diffusers' ``Timesteps`` returns float32 by design; a bf16 model's forward hands it straight to
its ``TimestepEmbedding`` (``s.time_embedding(s.time_proj(t))``). The fix is that forward line, the inner call's
output cast to the forward's input dtype, proven by the whole forward on a copy, with a diff of the user's file
(never a bare ``# pass input 0 ...``, never the library's line)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torchdoctor
from support.apps import load_file
from torchdoctor import PlacementError

NET = '''import torch, torch.nn as nn
from diffusers.models.embeddings import Timesteps, TimestepEmbedding


class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.time_proj = Timesteps(32, True, 0)
        s.time_embedding = TimestepEmbedding(32, 64)
        s.out = nn.Linear(64, 8)

    def forward(s, x, t):
        emb = s.time_embedding(s.time_proj(t))
        return s.out(emb) + x
'''
LINE = "        emb = s.time_embedding(s.time_proj(t))"
FIXED = "        emb = s.time_embedding(s.time_proj(t).to(x.dtype))"



def _call(net: torch.nn.Module) -> torch.Tensor:
    out: torch.Tensor = net(torch.randn(2, 8, dtype=torch.bfloat16), torch.tensor([10, 20]))
    return out


def test_a_library_output_handed_on_is_cast_at_the_forward_line(tmp_path: Path) -> None:
    src = tmp_path / "net.py"
    src.write_text(NET)
    net = load_file(src, "_td_handed").Net().to(torch.bfloat16)
    with pytest.raises(PlacementError) as info, torchdoctor.guard(net):
        _call(net)
    e = info.value
    assert e.fix == "emb = s.time_embedding(s.time_proj(t).to(x.dtype))  # net.py:13", str(e)
    assert f"-{LINE}\n" in (e.patch or "") and f"+{FIXED}\n" in (e.patch or ""), e.patch
    assert "fix proven: the whole forward runs again on a copy of the model with the output of `time_proj` -> " \
           "bfloat16" in str(e)
    assert "is what `s.time_proj(t)` returns at " in str(e)
    src.write_text(NET.replace(LINE, FIXED))  # the printed diff, applied: quiet, in the model's dtype
    fixed = load_file(src, "_td_handed_fixed").Net().to(torch.bfloat16)
    with torchdoctor.guard(fixed) as g:
        out = _call(fixed)
    assert out.dtype == torch.bfloat16 and not g.report().problems
