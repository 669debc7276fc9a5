"""A submodule's float32 output handed on to a bf16 submodule (diffusers' ``Timesteps`` into ``TimestepEmbedding``, or
the user's own sinusoidal embedding into a ``Linear``), in every guard mode: strict, fix and warn name the forward
line that hands it on, cast there, proven by the whole forward on a copy, with a diff, as explain does; the output
bound to a name first (``e = s.temb(t)`` then ``s.lin(e)``) is cast where the name is bound."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

import torchdoctor
from support.apps import load_file
from torchdoctor import PlacementError

DIFFUSERS = '''import torch, torch.nn as nn
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
OWN = '''import math, torch, torch.nn as nn


class SinEmb(nn.Module):
    def forward(self, t):
        freqs = torch.exp(-math.log(10000) * torch.arange(16, dtype=torch.float32) / 16)
        args = t[:, None].float() * freqs[None]
        return torch.cat([args.sin(), args.cos()], dim=-1)


class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.temb = SinEmb()
        s.lin = nn.Linear(32, 8)

    def forward(s, x, t):
        e = s.temb(t)
        return s.lin(e) + x
'''
CASES = {  # source, the line, the fixed line, its number, the inner call, the submodule's path
    "diffusers": (DIFFUSERS, "        emb = s.time_embedding(s.time_proj(t))",
                  "        emb = s.time_embedding(s.time_proj(t).to(x.dtype))", 13, "s.time_proj(t)", "time_proj"),
    "own": (OWN, "        e = s.temb(t)", "        e = s.temb(t).to(x.dtype)", 18, "s.temb(t)", "temb"),
}


def _call(net: torch.nn.Module) -> torch.Tensor:
    out: torch.Tensor = net(torch.randn(2, 8, dtype=torch.bfloat16), torch.tensor([10, 20]))
    return out


def _check(fix: str | None, patch: str | None, proof: str | None, said: str, case: str) -> None:
    _, line, fixed, at, inner, sub = CASES[case]
    assert fix == f"{fixed.strip()}  # net.py:{at}", fix
    assert f"-{line}\n" in (patch or "") and f"+{fixed}\n" in (patch or ""), patch
    assert proof == f"fix proven: the whole forward runs again on a copy of the model with the output of `{sub}` -> " \
                    "bfloat16", proof
    assert f"is what `{inner}` returns at " in said and f"net.py:{at}" in said, said


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_the_handing_line_is_the_fix_when_the_error_is_raised(tmp_path: Path, case: str, mode: str) -> None:
    src = tmp_path / "net.py"
    src.write_text(CASES[case][0])
    net = load_file(src, f"_td_handed_{case}_{mode}").Net().to(torch.bfloat16)
    with pytest.raises(PlacementError) as info, torchdoctor.guard(net, mode=mode):
        _call(net)
    e = info.value
    assert "# pass" not in str(e), str(e)
    _check(e.fix, e.patch, e.proof, str(e), case)
    src.write_text(CASES[case][0].replace(CASES[case][1], CASES[case][2]))  # the printed diff, applied: quiet
    fixed = load_file(src, f"_td_handed_{case}_{mode}_fixed").Net().to(torch.bfloat16)
    with torchdoctor.guard(fixed, mode=mode) as g:
        out = _call(fixed)
    assert out.dtype == torch.bfloat16 and not g.report().problems


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("mode", ["fix", "warn"])
def test_fix_and_warn_keep_the_handing_line_as_the_note(tmp_path: Path, case: str, mode: str) -> None:
    src = tmp_path / "net.py"
    src.write_text(CASES[case][0])
    net = load_file(src, f"_td_handed_{case}_{mode}_note").Net().to(torch.bfloat16)
    with pytest.warns(torchdoctor.PlacementWarning) if mode == "warn" else contextlib.nullcontext(), \
            torchdoctor.guard(net, mode=mode) as g:
        out = _call(net)
    assert out.dtype == torch.bfloat16
    (note,) = g.report().notes.values()
    _check(note.fix, note.patch, note.proof, note.maker or "", case)
